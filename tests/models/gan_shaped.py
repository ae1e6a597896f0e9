"""A training loop shaped like pytorch/examples' dcgan (two models, two optimizers, the
discriminator stepped on a real and a fake batch), tiny and on synthetic data, with no
GradScope in it."""

import sys

import torch
from torch import nn

torch.manual_seed(0)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, x):
        return self.main(x).view(-1)


netG, netD = Generator(), Discriminator()
criterion = nn.BCEWithLogitsLoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 5
for i in range(iterations):
    real = torch.randn(16, 8)
    netD.zero_grad()
    errD_real = criterion(netD(real), torch.ones(16))
    errD_real.backward()
    fake = netG(torch.randn(16, 4))
    errD_fake = criterion(netD(fake.detach()), torch.zeros(16))
    errD_fake.backward()
    optimizerD.step()
    netG.zero_grad()
    errG = criterion(netD(fake), torch.ones(16))
    errG.backward()
    optimizerG.step()
    print(f"[{i}] Loss_D: {(errD_real + errD_fake).item():.4f} Loss_G: {errG.item():.4f}")

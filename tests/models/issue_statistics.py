"""The two statistics of issue #36's example, exactly as a user writes them (the public
protocol's contract): the tests of the engine, the sinks and the app all use these."""

import gradscope


class GradRMS(gradscope.Statistic):
    name = "grad_rms"  # the key in StepStats, recordings, JSON, CSV, tags
    label = "RMS of the gradient"  # what the app's selector shows
    combine = "max"  # a layer's parameters: "sum", "max", "rss" (root of summed squares) or "mean"
    every = 1  # measured at steps 0, every, 2*every, ...; default: the watch's detail_every

    def parameter(self, grad, weight):  # one parameter: a 0-d tensor, on its device, no .item()
        return grad.float().pow(2).mean().sqrt()


class OutRMS(gradscope.Statistic):
    name = "out_rms"
    every = 2  # steps 0, 2, 4, ...

    def output(self, module, output):  # a forward statistic, on each watched module's output
        return output.float().pow(2).mean().sqrt()

"""Writing scalars and text to a TensorBoard log folder with the ``tensorboard`` package's own
event writer (no TensorFlow, no torch.utils.tensorboard): one event per step holding every
tag, so a model with hundreds of layers costs one record per step, not one per value."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gradscope.core.errors import GradScopeError
from gradscope.core.export.optional_import import require


class TensorBoardEvents:
    """An event file in ``logdir`` (created when missing); ``close()`` flushes it."""

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        writer_module = require("tensorboard.summary.writer.event_file_writer")
        self._event_pb2 = require("tensorboard.compat.proto.event_pb2")
        self._summary_pb2 = require("tensorboard.compat.proto.summary_pb2")
        self._tensor_pb2 = require("tensorboard.compat.proto.tensor_pb2")
        self._shape_pb2 = require("tensorboard.compat.proto.tensor_shape_pb2")
        self.logdir = Path(logdir).expanduser()
        try:
            self.logdir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise GradScopeError(
                f"cannot write TensorBoard events to {self.logdir}: {error.strerror or error}"
            ) from None
        if not os.access(self.logdir, os.W_OK):
            raise GradScopeError(
                f"cannot write TensorBoard events to {self.logdir}: the folder is not writable"
            )
        self._writer = writer_module.EventFileWriter(str(self.logdir), flush_secs=2)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        summary = self._summary_pb2.Summary
        event = self._event_pb2.Event(
            wall_time=time.time(),
            step=int(step),
            summary=summary(
                value=[summary.Value(tag=tag, simple_value=value) for tag, value in values.items()]
            ),
        )
        self._writer.add_event(event)

    def text(self, step: int, tag: str, text: str) -> None:
        summary_pb2 = self._summary_pb2
        tensor = self._tensor_pb2.TensorProto(
            dtype="DT_STRING",
            string_val=[text.encode("utf-8")],
            tensor_shape=self._shape_pb2.TensorShapeProto(
                dim=[self._shape_pb2.TensorShapeProto.Dim(size=1)]
            ),
        )
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text")
        )
        value = summary_pb2.Summary.Value(tag=tag, metadata=metadata, tensor=tensor)
        event = self._event_pb2.Event(
            wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=[value])
        )
        self._writer.add_event(event)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

"""Recordings: a training run's statistics in one SQLite file, written while training runs
and readable (by another process too) while it is being written.
"""

from gradscope.core.recording.csv_export import write_csv
from gradscope.core.recording.format import FORMAT_NAME, FORMAT_VERSION, SUFFIX
from gradscope.core.recording.reader import RecordingReader
from gradscope.core.recording.sink import RecordingSink, choose_recording_path
from gradscope.core.recording.writer import RecordingWriter

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "SUFFIX",
    "RecordingReader",
    "RecordingSink",
    "RecordingWriter",
    "choose_recording_path",
    "write_csv",
]

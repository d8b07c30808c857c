"""The MP4 core of the episode byte-range path (private: use it through episodes/).

build_index reads a file's sample tables through range reads, episode_span
picks the samples and the one byte range an episode needs, and
synthesize_mini_mp4 wraps those bytes into a small MP4 that decodes to the
same frames as the source.
"""
from episodes._mp4.index import Mp4Index, build_index
from episodes._mp4.span import EpisodeSpan, episode_span
from episodes._mp4.writer import MiniMp4, synthesize_mini_mp4

__all__ = ["EpisodeSpan", "MiniMp4", "Mp4Index", "build_index", "episode_span", "synthesize_mini_mp4"]

"""Event-time tumbling windows, watermarks, idle partitions and late data. Knows nothing of DP."""

from stream_dp.windows.tumbling import TumblingWindows
from stream_dp.windows.watermark import WatermarkTracker

__all__ = ["TumblingWindows", "WatermarkTracker"]

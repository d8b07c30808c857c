"""From a config file to a planned pipeline: everything checked and decided before a process starts."""
from pathlib import Path

# The embedded default ships in the package, so an installed command runs it from any directory; the checkout's
# config/default.json is a link to it.  Here, not in rnb.pipeline.config, so that rnb.launch reads it
# before the config's checks are imported (a quarter of a second).
DEFAULT_CONFIG_PATH = Path(__file__).resolve().with_name("default.json")

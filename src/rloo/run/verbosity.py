"""How much the libraries underneath a run print: their progress bars and log levels (`log_level`).

transformers draws a bar for every model it loads or saves ("Loading weights", "Writing model shards")
and datasets one for every file it reads ("Generating train split"); in a training console they bury
the lines that matter. The default, "passive", hides those two libraries' bars and leaves every log
level alone (TRL's "passive" keeps transformers' level too); Hub downloads keep their bars, since a
download can take minutes. "debug" and "info" show every bar and set the level of transformers',
datasets' and rloo's loggers; "warning", "error" and "critical" set the level and hide every bar.
"""

from __future__ import annotations

import logging

SHOWS_BARS = ("debug", "info")


def set_library_verbosity(log_level: str) -> None:
    """Apply `log_level` (one of config_checks.LOG_LEVELS) to transformers, datasets, huggingface_hub and rloo."""
    import datasets
    import huggingface_hub.utils
    import transformers

    if log_level in SHOWS_BARS:
        transformers.utils.logging.enable_progress_bar()
        datasets.enable_progress_bars()
        huggingface_hub.utils.enable_progress_bars()
    else:
        downloads_hidden = huggingface_hub.utils.are_progress_bars_disabled()
        transformers.utils.logging.disable_progress_bar()  # which hides the Hub's bars too
        datasets.disable_progress_bars()
        if log_level == "passive" and not downloads_hidden:
            huggingface_hub.utils.enable_progress_bars()  # downloads keep their bars
        elif log_level != "passive":
            huggingface_hub.utils.disable_progress_bars()
    if log_level != "passive":
        level = getattr(logging, log_level.upper())
        transformers.utils.logging.set_verbosity(level)
        datasets.utils.logging.set_verbosity(level)
        logging.getLogger("rloo").setLevel(level)

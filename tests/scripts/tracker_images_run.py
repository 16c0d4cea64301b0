"""One logging step of a completions table whose rows carry log_multimodal's "image" files, to the tracker
named on the command line, through the trainer's own MetricsLogger, for tests/run/test_tracker_images.py.

Run in its own process so that each tracker reads its environment (WANDB_MODE, WANDB_DIR, TRACKIO_DIR, ...)
fresh. The images are written by `data.images.save_images`, as log_multimodal writes them: a 20x10 red and an
8x12 blue image; rows 0 and 1 (one group) show the red one, row 2 both ("one-each": the blue one alone;
"text-only": no image column, as with log_multimodal=False).
usage: python tracker_images_run.py OUTPUT_DIR RUN_NAME TRACKER [one-each|text-only]
"""

import sys

from accelerate import Accelerator
from PIL import Image

from rloo.data.images import save_images
from rloo.run.metrics import MetricsLogger
from rloo.run.trackers import accelerate_log_with

if __name__ == "__main__":
    output_dir, run_name, tracker = sys.argv[1], sys.argv[2], sys.argv[3]
    mode = sys.argv[4] if len(sys.argv) > 4 else "both"
    red, blue = save_images([Image.new("RGB", (20, 10), "red"), Image.new("RGB", (8, 12), "blue")],
                            f"{output_dir}/images")
    image_column = [[red], [red], [blue] if mode == "one-each" else [red, blue]]
    rows = [{"step": 1, "prompt": f"p{i // 2}", "completion": f"c{i}", "score": 0.5, "advantage": 0.1 * i,
             **({} if mode == "text-only" else {"image": image_column[i]})} for i in range(3)]
    accelerator = Accelerator(log_with=accelerate_log_with([tracker], output_dir))
    logger = MetricsLogger(accelerator, output_dir, [tracker], console=False)
    logger.start({"learning_rate": 1e-3}, run_name)
    logger.log({"reward": 1.0}, step=1)
    logger.log_completions(rows, step=1)
    accelerator.end_training()

"""The baseline: the base model itself, copied to final_model/ unchanged."""

import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    target = os.path.join(HERE, "final_model")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(os.path.join(HERE, "base_model"), target)
    print(f"copied base_model/ to {target}")

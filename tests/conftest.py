import os

# No test may reach the Hugging Face hub; without these flags huggingface_hub retries for ~20 s.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

pytest_plugins = ["loopback", "workflow_runs", "stage_fixtures", "finished_run"]

"""With FLINT_FAKE_SM90=1 and this folder on PYTHONPATH, every Python process (the precompile's worker processes
too) starts with Triton told that its device is an sm_90 GPU (`fake_sm90`)."""

import os

if os.environ.get("FLINT_FAKE_SM90") == "1":
    import fake_sm90  # noqa: F401

"""The paper's protocol on a real pretrained LLM: now ``locos reproduce`` (the code is
:mod:`locos_tl.experiments.protocol`). This wrapper keeps the old command working::

    python benchmarks/real_models.py --model smollm2-135m-instruct --out runs/real/smollm2
"""

from locos_tl.experiments.protocol.main import main

if __name__ == "__main__":
    raise SystemExit(main())

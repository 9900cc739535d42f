"""The paper's protocol on a real pretrained LLM as a script: the same as ``locos
reproduce`` (the code is :mod:`locos_tl.experiments.protocol`)::

    python experiments/real_models.py --model smollm2-135m-instruct --out runs/real/smollm2
"""

from locos_tl.experiments.protocol.main import main

if __name__ == "__main__":
    raise SystemExit(main())

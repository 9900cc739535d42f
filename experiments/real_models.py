"""The paper's protocol on a real pretrained LLM as a script: the same as ``locos
reproduce`` (the code is :mod:`locos_tl.experiments.protocol`)::

    python experiments/real_models.py --model smollm2-135m-instruct --out runs/real/smollm2
"""

import sys

from locos_tl.cli import app

if __name__ == "__main__":
    app(["reproduce", *sys.argv[1:]], prog_name="locos")

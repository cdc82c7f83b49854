"""``helpers.sizing.measure("cuda")`` on a rehearsal's card: what the torch probe would print, from the card's
datasheet at the shares a real card reaches (:data:`ci.rehearse.cards.ACHIEVED_BANDWIDTH`, ``ACHIEVED_FLOPS``).

Invoked as ``python -m ci.rehearse.gpu_probe`` (``LABS_GPU_PROBE``); prints one JSON line of
``helpers.sizing.Hardware``'s fields. A stand-in's figure: never a number a learner sees.
"""

import json
import os
import sys
from pathlib import Path

from .cards import ACHIEVED_BANDWIDTH, ACHIEVED_FLOPS, Machine


def main() -> int:
    m = Machine.from_json(Path(os.environ["REHEARSAL_MACHINE"]).read_text())
    c = m.card
    bf16 = c.bf16_flops * ACHIEVED_FLOPS if c.bf16_flops else None
    print(json.dumps({"name": c.name, "memory_gib": round(c.memory_bytes / 2**30, 1),
                      "memory_bandwidth": c.bandwidth * ACHIEVED_BANDWIDTH, "bf16_flops": bf16,
                      "fp16_flops": c.fp16_flops * ACHIEVED_FLOPS, "fp8_flops": c.fp8_flops, "fp4_flops": c.fp4_flops,
                      "price_per_hour": None, "source": "rehearsal stand-in: the card's datasheet at the shares a "
                      "real card reaches (not measured)", "measured": True, "fp32_flops": None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The capped backward (softcap 50) at D=64 and D=128 on the sm90 one pass, which configs.BWD_HOPPER_SOFTCAP does not
enter yet, against the portable backward (what those calls run today) and FA4 where PYTHONPATH has it: flashtile.bench
after entering the candidates (D=64 in 64-row steps: its 128 spill with a cap), peers taking turns in one process.

    PYTHONPATH=. python3 scripts/softcap_bwd_ab.py [more bench arguments, e.g. --seqlens 4096 16384 --out DIR]
"""
import dataclasses
import sys

from flashtile import configs
from flashtile.bench.__main__ import main

CANDIDATES = {**{(64, causal): dataclasses.replace(configs.BWD_HOPPER[(64, causal)], block_m=64)
                 for causal in (False, True)},
              **{(128, causal): configs.BWD_HOPPER[(128, causal)] for causal in (False, True)}}

if __name__ == "__main__":
    configs.BWD_HOPPER_SOFTCAP.update(CANDIDATES)
    main(["--backward", "--head-dims", "64", "128", "--rounds", "1", "--memory-seqlens", "--peers",
          "flashtile (softcap 50)", "flashtile (portable, softcap 50)", "FA4 (softcap 50)"] + sys.argv[1:])

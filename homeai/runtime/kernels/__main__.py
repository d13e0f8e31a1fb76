"""``python -m homeai.runtime.kernels``: build the native kernels now (``make test`` and ``make run`` do,
so no request or test waits for the compiler) and say which ones this machine uses."""

from __future__ import annotations

import logging
import sys
import time

from homeai.runtime import kernels


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.perf_counter()
    found = {"int8_linear": kernels.int8_linear(), "int4_linear": kernels.int4_linear(),
             "float_linear": kernels.float_linear(),
             "decode_attention": kernels.decode_attention()}
    used = [name for name, op in found.items() if op is not None]
    print(f"native kernels ({time.perf_counter() - start:.1f} s): {', '.join(used) or 'none'} "
          f"in {kernels.build_dir() if used else '-'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

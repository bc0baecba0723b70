"""A fuzz campaign from the command line (the long runs; pytest runs a short
one through the same code):

    .venv/bin/python tests/fuzz/campaign.py --mutants 20000 --seed 7 --out /tmp/fuzz7

Prints the per-runtime x class table and every crash or hang; fusekit's are
saved under tests/fuzz/regressions/ (--regressions elsewhere).  Exit status 1
when fusekit crashed or hung.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from fusekit.testing import mutate  # noqa: E402
from fuzz import builders, engine  # noqa: E402


def kernels_and_plugin(extra_cflags: tuple[str, ...] = ()) -> tuple[str, list[str], list[str]]:
    """(plugin path, library kernel names, plugin kernel names)."""
    import fusekit

    plugin = builders.build_plugin(extra_cflags)
    return plugin, sorted(fusekit.kernel_names()), sorted(fusekit.kernel_names(plugin))


def prepare(work: Path, extra_cflags: tuple[str, ...] = (), sanitized: bool = False):
    """Builds what a campaign needs under `work` (reused when already
    there): the native helpers, the user plugin, the base models."""
    os.environ.setdefault("FUSEKIT_CACHE_DIR", str(work / "plugin_cache"))
    control, trace = engine.build_native(work / "native")
    plugin, library_ops, user_ops = kernels_and_plugin(extra_cflags)
    missing = builders.missing_builders(library_ops)
    if missing:
        raise ValueError(
            f"kernels without a fuzz model builder in tests/fuzz/builders.py: {missing}"
        )
    models = builders.build_base_models(work / "base", library_ops)
    kernels = library_ops + user_ops
    bases = mutate.describe_bases(models, set(kernels))
    settings = engine.Settings(
        plugins=[plugin],
        control_lib=control,
        # One control delegate per library, as fusekit.Interpreter loads them.
        control_ops=[library_ops, user_ops],
        crash_trace=None if sanitized else trace,
    )
    if sanitized:
        settings.rlimit_as = None
        settings.keep_logs = True
        settings.faulthandler = False
    return settings, bases, kernels


def generate(seed: int, count: int, bases, kernels) -> list[mutate.Mutant]:
    return [mutate.make_mutant(seed, k, bases, kernels) for k in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", type=int, default=2000, help="mutants per runtime")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True, help="work folder (kept)")
    parser.add_argument("--runtimes", default=",".join(engine.RUNTIMES))
    parser.add_argument(
        "--modes",
        default="fusekit",
        help="fusekit (fusekit.Interpreter) and/or delegate (load_delegate)",
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds per mutant")
    parser.add_argument("--regressions", type=Path, default=engine.REGRESSIONS)
    parser.add_argument("--no-replay", action="store_true", help="skip regressions/")
    parser.add_argument(
        "--sanitized",
        action="store_true",
        help="workers run under sanitizers (set LD_PRELOAD etc. yourself)",
    )
    parser.add_argument("--extra-cflags", default="", help="for the user plugin build")
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment of the worker processes only (sanitizer preloads)",
    )
    args = parser.parse_args(argv)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    t0 = time.time()
    settings, bases, kernels = prepare(
        args.out, tuple(args.extra_cflags.split()), sanitized=args.sanitized
    )
    settings.runtimes = tuple(args.runtimes.split(","))
    settings.modes = tuple(args.modes.split(","))
    settings.extra_env = dict(item.split("=", 1) for item in args.worker_env)
    settings.jobs, settings.timeout, settings.regressions = (
        args.jobs,
        args.timeout,
        args.regressions,
    )
    mutants = [] if args.no_replay else engine.load_regressions(args.regressions)
    mutants += generate(args.seed, args.mutants, bases, kernels)
    print(f"{len(mutants)} mutants made in {time.time() - t0:.0f} s", flush=True)
    campaign = engine.Campaign(args.out / f"seed{args.seed}", settings, mutants)
    campaign.run()
    campaign.dump()
    print(campaign.summary())
    return 1 if campaign.fusekit_failures() else 0


if __name__ == "__main__":
    sys.exit(main())

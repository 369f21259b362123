"""A PBT search written by hand with Ray Tune's own API, as a Ray Tune user writes one:
``tune.Tuner`` over a function trainable with ``PopulationBasedTraining`` (synchronous; with
the two fixes raydock's search has, ``tuning.schedulers.SynchSafePBT``, without which Tune
left the population waiting at a perturbation point for ever in about one run of a few,
as it did raydock's). ``bench.pbt_warm``
submits it as a Ray job (the job submission client) to the cluster it runs raydock's
search on, with the search's population, perturbation interval, quantile, resampling,
perturbation factors, seed, per-trial CPUs and stopping rule:

    python -m bench.pbt_by_hand --task nqm --trials 8 --epochs 40 --interval 8 --storage /tmp/x

The function is ``bench.pbt_tasks.nqm_function`` (the noisy quadratic, the very function
raydock's search runs as ``trainable: function``) or ``bench.pbt_tasks.digits_function``
(the digits example's built-in model, data, optimizer and batches, trained in the
trainable's own process). It prints one JSON line: the search's wall time inside the
job (``Tuner.fit``), the Unix time of the first trial result and of this process' start,
and how many exploits PBT made.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from ray import tune
from ray.tune.search import BasicVariantGenerator

from tuning.schedulers import SynchSafePBT

RESULT_PREFIX = "pbt_by_hand: "
STARTED = time.time()


class FirstResult(tune.Callback):
    def __init__(self) -> None:
        self.at: float | None = None

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if self.at is None:
            self.at = time.time()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=("nqm", "digits"), required=True)
    parser.add_argument("--trials", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--interval", type=int, required=True)
    parser.add_argument("--quantile", type=float, default=0.25)
    parser.add_argument("--resample", type=float, default=0.25)
    parser.add_argument("--factors", type=float, nargs=2, default=(1.2, 0.8))
    parser.add_argument("--low", type=float, required=True, help="the searched lr's range (loguniform)")
    parser.add_argument("--high", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpus-per-trial", type=float, required=True)
    parser.add_argument("--base", default="{}", help="digits: the built-in training spec, JSON")
    parser.add_argument("--metric", required=True)
    parser.add_argument("--mode", choices=("min", "max"), required=True)
    parser.add_argument("--storage", required=True)
    args = parser.parse_args()

    from bench.pbt_tasks import digits_function, nqm_function

    lr = tune.loguniform(args.low, args.high)
    if args.task == "nqm":
        function, space = nqm_function, {"lr": lr, "seed": args.seed}
    else:
        function, space = digits_function, {"lr": lr, "base": json.loads(args.base), "epochs": args.epochs}
    random.seed(args.seed)  # PBT draws its donors and perturbations from `random`
    pbt = SynchSafePBT(
        time_attr="epoch",
        perturbation_interval=args.interval,
        quantile_fraction=args.quantile,
        resample_probability=args.resample,
        perturbation_factors=tuple(args.factors),
        hyperparam_mutations={"lr": lr},
        synch=True,  # the population meets at each perturbation point
    )
    first = FirstResult()
    tuner = tune.Tuner(
        tune.with_resources(function, {"cpu": args.cpus_per_trial}),
        param_space=space,
        tune_config=tune.TuneConfig(
            metric=args.metric,
            mode=args.mode,
            num_samples=args.trials,
            scheduler=pbt,
            search_alg=BasicVariantGenerator(random_state=args.seed, max_concurrent=args.trials),
        ),
        run_config=tune.RunConfig(
            name=f"by-hand-{args.task}",
            storage_path=args.storage,
            stop={"epoch": args.epochs},
            callbacks=[first],
            verbose=0,
        ),
    )
    t0 = time.perf_counter()
    results = tuner.fit()
    fit_s = time.perf_counter() - t0
    errors = [str(r.error) for r in results if r.error is not None]
    best = results.get_best_result(args.metric, args.mode).metrics or {}
    out = {
        "fit_s": round(fit_s, 3),
        "started_unix": STARTED,
        "first_result_unix": first.at,
        "exploits": getattr(pbt, "_num_perturbations", None),
        "best": best.get(args.metric),
        "errors": errors[:3],
    }
    print(RESULT_PREFIX + json.dumps(out), flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

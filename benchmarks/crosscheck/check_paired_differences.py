#!/usr/bin/env python3
"""Independent check of paired PR / accuracy / robustness differences (numpy only).

  python benchmarks/crosscheck/check_paired_differences.py --a pat --b pgd [--runs-dir DIR] [--also-seed 1]


For methods A and B (e.g. --a pat --b pgd), for each seed s where both
<runs>/<A>_s<s>/eval/per_image.npz and <runs>/<B>_s<s>/eval/per_image.npz exist,
and for the mean over those seeds, computes

  dAcc, dPGD-20, dCW-20           mean(x_A) - mean(x_B) over all images
  Table-1 estimand (per eps)      PR_A over A's clean-correct - PR_B over B's clean-correct
  both-correct (per eps)          mean over {A correct and B correct} of PR_A,i - PR_B,i
  all images (per eps)            mean over all images of PR_A,i - PR_B,i

with PR_i = counts_i / N.  Intervals: percentile bootstrap over images with one
index matrix idx = default_rng(seed).integers(0, n, size=(R, n)) shared by every
seed and every figure; ratios are recomputed as ratios of sums over each resample;
the mean-over-seeds figure per resample is the mean of the per-seed resampled
figures.  All numbers are printed in percentage points.

This file does not import or copy the patjax package.
"""

import argparse
import glob
import json
import os
import re
import sys

import numpy as np

DEFAULT_RUNS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "docs/results/convergence_cpu/runs/cifar10_small_cnn",
)
LAWS = ("uniform", "gaussian")  # the eps-scaled laws; whichever of them every run was evaluated under


def load_run(runs_dir, name):
    d = os.path.join(runs_dir, name, "eval")
    npz = np.load(os.path.join(d, "per_image.npz"))
    with open(os.path.join(d, "results.json")) as f:
        res = json.load(f)
    st = res["settings"]
    # PR's settings: results.json's "pr" block, or, in a file written before the settings were
    # nested, their flat names (read here by hand: this check reads no patjax code).
    pr = st["pr"] if "pr" in st else {"samples": st["pr_samples"], "epsilons": st["pr_epsilons"]}
    N = int(pr["samples"])
    for key in ("meta.pr.samples", "meta.pr_samples"):
        if key in npz.files:
            assert int(npz[key]) == N, (name, "N mismatch")
    run = {
        "name": name,
        "settings": st,
        "N": N,
        "eps": [float(e) for e in pr["epsilons"]],
        "image_index": npz["image_index"] if "image_index" in npz.files else None,
        "correct": npz["clean.correct"].astype(bool),
        "pgd": npz["pgd20.robust"].astype(bool),
        "cw": npz["cw20.robust"].astype(bool),
    }
    n = run["correct"].shape[0]
    for law in (law for law in LAWS if f"pr_{law}.counts" in npz.files):
        c = npz[f"pr_{law}.counts"].astype(np.float64)
        assert c.shape == (n, len(run["eps"])), (name, law, c.shape)
        assert c.min() >= 0 and c.max() <= N
        run[law] = c / N
        if f"pr_{law}.pr" in npz.files:  # sanity: stored PR equals counts/N
            assert np.allclose(npz[f"pr_{law}.pr"], run[law]), (name, law)
    return run


def find_seeds(runs_dir, method):
    seeds = []
    for p in glob.glob(os.path.join(runs_dir, f"{method}_s*", "eval", "per_image.npz")):
        m = re.fullmatch(re.escape(method) + r"_s(\d+)", os.path.basename(os.path.dirname(os.path.dirname(p))))
        if m and os.path.exists(os.path.join(os.path.dirname(p), "results.json")):
            seeds.append(int(m.group(1)))
    return sorted(seeds)


def resample_weights(n, R, seed):
    """C[r, j] = number of times image j appears in resample r (sum over resample == C @ x)."""
    idx = np.random.default_rng(seed).integers(0, n, size=(R, n))
    C = np.zeros((R, n), dtype=np.float64)
    np.add.at(C, (np.repeat(np.arange(R), n), idx.ravel()), 1.0)
    return C


def figures(W, A, B, n):
    """Figures from image weights W (shape (k, n)); W = ones(1, n) gives the point estimate.

    Returns dict name -> array of shape (k,) or (k, n_eps), as fractions.
    """
    cA = A["correct"].astype(np.float64)
    cB = B["correct"].astype(np.float64)
    both = cA * cB
    tot = W.sum(axis=1)  # == n for every resample
    out = {
        "dAcc": W @ (cA - cB) / tot,
        "dPGD": W @ (A["pgd"].astype(np.float64) - B["pgd"].astype(np.float64)) / tot,
        "dCW": W @ (A["cw"].astype(np.float64) - B["cw"].astype(np.float64)) / tot,
    }
    nA = (W @ cA)[:, None]
    nB = (W @ cB)[:, None]
    nboth = (W @ both)[:, None]
    for law in (law for law in LAWS if law in A and law in B):
        pA, pB = A[law], B[law]
        out[f"{law}.table1"] = (W @ (pA * cA[:, None])) / nA - (W @ (pB * cB[:, None])) / nB
        with np.errstate(invalid="ignore", divide="ignore"):
            out[f"{law}.both"] = (W @ ((pA - pB) * both[:, None])) / nboth
        out[f"{law}.all"] = (W @ (pA - pB)) / tot[:, None]
    return out


def fmt(x, signed=True):
    return f"{100 * x:+.2f}" if signed else f"{100 * x:.2f}"


def fmt_ci(pt, lo, hi):
    return f"{fmt(pt)} [{fmt(lo)}, {fmt(hi)}]"


def results_md_cells(path: str, label: str) -> dict:
    """{(figure, column): 'point [lo, hi]'} of the rows `label` (e.g. 'PAT − PGD') in a suite
    report's paired-difference tables; figure as this script names them, column 's<seed>' or 'mean'."""
    cell = re.compile(r"([+-]?\d+\.\d+) \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]")
    out = {}
    for section in re.split(r"\n### ", open(path).read()):
        m = re.match(r"Paired differences A − B \((\w+) noise; percentage points; PR over (.*?)\)", section)
        if not m:
            continue
        law, over = m.group(1), m.group(2)
        estimand = "table1" if "own clean-correct" in over else "both" if "both runs" in over else "all"
        current = False
        for row in section.splitlines():
            if row.startswith("| ") and not row.startswith("|  |"):
                current = row.startswith(f"| {label} |")
            if not (current and row.startswith("|")):
                continue
            column = row.strip("|").split("|")[1].strip()
            column = "mean" if column == "mean" else "s" + column.removeprefix("seed ").strip()
            names = ["dAcc", "dPGD", "dCW"] + [f"{law}.{estimand}.{j}" for j in range(4)]
            for name, found in zip(names, cell.findall(row)):
                out[(name, column)] = "{} [{}, {}]".format(*found)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs-dir", default=DEFAULT_RUNS)
    ap.add_argument("--a", default="pat", help="method A (run dirs <A>_s<seed>)")
    ap.add_argument("--b", default="pgd", help="method B")
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="*",
        default=None,
        help="restrict to these training seeds (default: all where both exist)",
    )
    ap.add_argument(
        "--boot-seed",
        type=int,
        default=None,
        help="bootstrap resampling seed (default: settings.seed from results.json)",
    )
    ap.add_argument(
        "--also-seed",
        type=int,
        action="append",
        default=[],
        help="repeat the intervals with this extra resampling seed (repeatable)",
    )
    ap.add_argument(
        "--resamples", type=int, default=None, help="bootstrap resamples R (default: settings.bootstrap_resamples)"
    )
    ap.add_argument(
        "--check-results-md",
        default=None,
        metavar="PATH",
        help="compare every paired cell of this suite report's rows --label with the recomputation; "
        "exit 1 on any difference",
    )
    ap.add_argument("--label", default=None, help="the report's row label (default: 'A − B' in capitals)")
    args = ap.parse_args()

    sa, sb = find_seeds(args.runs_dir, args.a), find_seeds(args.runs_dir, args.b)
    seeds = sorted(set(sa) & set(sb))
    if args.seeds is not None:
        seeds = [s for s in seeds if s in set(args.seeds)]
    if not seeds:
        sys.exit(f"no seed with both {args.a}_s* and {args.b}_s* evaluated (A: {sa}, B: {sb})")

    pairs = {s: (load_run(args.runs_dir, f"{args.a}_s{s}"), load_run(args.runs_dir, f"{args.b}_s{s}")) for s in seeds}
    runs = [r for s in seeds for r in pairs[s]]
    st0 = runs[0]["settings"]
    n = runs[0]["correct"].shape[0]
    eps = runs[0]["eps"]
    # Pairing checks: same images, same N, same eps, same evaluation/bootstrap settings.
    for r in runs:
        st = r["settings"]
        assert r["correct"].shape[0] == n and r["eps"] == eps and r["N"] == runs[0]["N"], r["name"]
        for key in ("seed", "bootstrap_resamples", "confidence", "num_examples", "split", "dataset"):
            if st.get(key) != st0.get(key):
                sys.exit(
                    f"not paired: settings.{key} differs: {r['name']}={st.get(key)} vs {runs[0]['name']}={st0.get(key)}"
                )
        if r["image_index"] is not None and runs[0]["image_index"] is not None:
            assert np.array_equal(r["image_index"], runs[0]["image_index"]), f"image_index differs: {r['name']}"

    laws = [law for law in LAWS if all(law in r for r in runs)]
    if not laws:
        sys.exit(f"no law of {LAWS} evaluated in every run")
    R = args.resamples if args.resamples is not None else int(st0["bootstrap_resamples"])
    conf = float(st0.get("confidence", 0.95))
    q = [round(100 * (1 - conf) / 2, 10), round(100 * (1 + conf) / 2, 10)]
    boot_seeds = [args.boot_seed if args.boot_seed is not None else int(st0["seed"])] + list(args.also_seed)

    print(f"runs dir: {args.runs_dir}")
    print(
        f"A = {args.a}, B = {args.b}; seeds {seeds}; n = {n} images; N = {runs[0]['N']} noise samples; "
        f"eps = {eps}; R = {R}; confidence = {conf}; percentiles {q}"
    )
    print()

    # ---- per-run figures -------------------------------------------------
    hdr = f"{'run':<12}{'n_cc':>6}{'clean':>8}{'PGD-20':>8}{'CW-20':>8}"
    for law in laws:
        for e in eps:
            hdr += f"{law[:4] + '@' + str(e):>12}"
    print("Per run (pp); PR over the run's own clean-correct images")
    print(hdr)
    for r in runs:
        c = r["correct"]
        line = f"{r['name']:<12}{int(c.sum()):>6}"
        line += "".join(f"{fmt(x.mean(), False):>8}" for x in (c, r["pgd"], r["cw"]))
        for law in laws:
            for k in range(len(eps)):
                line += f"{fmt(r[law][c, k].mean(), False):>12}"
        print(line)
    print()
    print(
        "Both-correct images per seed: "
        + ", ".join(f"s{s}: {int((pairs[s][0]['correct'] & pairs[s][1]['correct']).sum())}" for s in seeds)
    )
    print()

    # ---- point estimates -------------------------------------------------
    ones = np.ones((1, n))
    point = {s: {k: v[0] for k, v in figures(ones, *pairs[s], n).items()} for s in seeds}
    point["mean"] = {k: np.mean([point[s][k] for s in seeds], axis=0) for k in point[seeds[0]]}
    cols = [f"s{s}" for s in seeds] + (["mean"] if len(seeds) > 1 else [])
    keys = [s for s in seeds] + (["mean"] if len(seeds) > 1 else [])

    computed = {}  # (figure, column) -> the printed cell, at the report's resampling seed
    for bs in boot_seeds:
        C = resample_weights(n, R, bs)
        boot = {s: figures(C, *pairs[s], n) for s in seeds}
        boot["mean"] = {k: np.mean([boot[s][k] for s in seeds], axis=0) for k in boot[seeds[0]]}
        # Resamples without a both-correct image are 0/0 (NaN): dropped, as the package drops them.
        ci = {k: {f: np.nanpercentile(boot[k][f], q, axis=0) for f in boot[k]} for k in keys}
        nan_note = {
            k: {
                f: int(
                    np.isnan(boot[k][f]).any(axis=tuple(range(1, boot[k][f].ndim))).sum()
                    if boot[k][f].ndim > 1
                    else np.isnan(boot[k][f]).sum()
                )
                for f in boot[k]
            }
            for k in keys
        }

        print("=" * 100)
        print(
            f"{args.a.upper()} - {args.b.upper()}  (pp, point [{q[0]}, {q[1]}] percentile bootstrap, "
            f"resampling seed {bs}, R = {R})"
        )
        print("=" * 100)
        w = 28
        print(f"{'figure':<30}" + "".join(f"{c:>{w}}" for c in cols))
        for f, lab in (("dAcc", "dAcc"), ("dPGD", "dPGD-20"), ("dCW", "dCW-20")):
            print(f"{lab:<30}" + "".join(f"{fmt_ci(point[k][f], *ci[k][f]):>{w}}" for k in keys))
            if bs == boot_seeds[0]:
                computed.update({(f, col): fmt_ci(point[k][f], *ci[k][f]) for k, col in zip(keys, cols)})
        for law in laws:
            for f, lab in (("table1", "Table-1 (own clean-correct)"), ("both", "both-correct"), ("all", "all images")):
                print(f"-- {law}, {lab}")
                for j, e in enumerate(eps):
                    line = f"{'  dPR(' + str(e) + ')':<30}"
                    for k in keys:
                        name = law + "." + f
                        text = fmt_ci(point[k][name][j], ci[k][name][0][j], ci[k][name][1][j])
                        line += f"{text:>{w}}"
                        if bs == boot_seeds[0]:
                            computed[(f"{name}.{j}", cols[keys.index(k)])] = text
                    print(line)
                bad = {k: nan_note[k][law + "." + f] for k in keys if nan_note[k][law + "." + f]}
                if bad:
                    print(f"  WARNING: resamples with undefined (0/0) values: {bad}")
        print()

    if args.check_results_md:
        label = args.label or f"{args.a.upper()} − {args.b.upper()}"
        reported = results_md_cells(args.check_results_md, label)
        differ = {k: (v, computed.get(k)) for k, v in reported.items() if computed.get(k) != v}
        print(f"{args.check_results_md}: {len(reported)} cells of '{label}' compared, {len(differ)} differ")
        for (name, column), (report, mine) in sorted(differ.items()):
            print(f"  {name} {column}: report {report}, recomputed {mine}")
        if differ or not reported:
            sys.exit(1)


if __name__ == "__main__":
    main()

"""What `simctl plan --out` writes, all or none (`results.output.write_files`): plan.json (the SLO, the rate,
every choice and every configuration's capacity), probes.parquet (every probed run) and pareto.png (output
tokens/s per GPU against tokens/s per user, one line per configuration, with the Pareto front of the runs
meeting the SLO and the choices shown: `simctl.plots.across_runs.pareto_figure`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from simctl.results.output import json_text, write_files

if TYPE_CHECKING:
    from simctl.studies.capacity import Capacity
    from simctl.studies.plan import Choice, PlanSpec


def _choice_row(c: Choice) -> dict[str, Any]:
    return {"configuration": c.label, "policy": c.config.policy, "gpu": c.config.gpu, "tp": c.config.tp,
            "options": c.config.options, "pd_split": c.candidate.split,
            "kv_link_gbps": c.candidate.kv_link_gbps, "gpus_per_replica": c.candidate.gpus,
            "refused_share": c.refused_share, "replicas": c.replicas, "gpus": c.gpus,
            "capacity_qps_per_replica": c.capacity_qps, "qps_per_gpu": c.qps_per_gpu,
            "tokens_per_s_per_gpu": c.tokens_per_gpu, "tokens_per_s_per_user": c.tokens_per_user,
            "headroom": c.headroom, "price_per_gpu_hour": c.price,
            "cost_per_million_output_tokens": c.cost_per_million_tokens, "checked": c.checked}


def write_plan(out: Path, spec: PlanSpec, choices: list[Choice], capacities: list[Capacity], top: int
               ) -> None:
    import matplotlib.pyplot as plt

    from simctl.plots.across_runs import pareto_figure
    from simctl.studies.capacity_files import probes_frame

    probes = probes_frame(capacities)
    text = json_text({
        "rate_qps": spec.rate, "slo": spec.slo.to_dict(), "slo_text": spec.slo.describe(),
        "max_gpus": spec.max_gpus, "prices": spec.prices, "choices": [_choice_row(c) for c in choices],
        "capacities": [{"configuration": r.name, "capacity_qps": r.qps, "problem": r.median_search.problem}
                       for r in capacities]})
    figure = pareto_figure(probes, [(c.label, c.tokens_per_user, c.tokens_per_gpu) for c in choices[:top]
                                    if c.tokens_per_user is not None])
    try:
        write_files(Path(out), {
            "plan.json": lambda p: p.write_text(text, encoding="utf-8"),
            "probes.parquet": lambda p: probes.to_parquet(p, index=False),
            "pareto.png": lambda p: figure.savefig(p, dpi=110, format="png"),
        }, "the plan files")
    finally:
        plt.close(figure)

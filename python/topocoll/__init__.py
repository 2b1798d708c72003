"""topocoll: topology-aware collective communication.

The planner (what NCCL 2.30.7 would build and choose on a machine, from its topology XML):

    import topocoll
    plan = topocoll.plan("dgx-h100.xml", nodes=2)          # the same data as `topocoll plan --json`
    plan["connect"]["rings"][0]

A torch.distributed backend for CPU tensors:

    import topocoll.torch                                   # registers the backend "topocoll"
    torch.distributed.init_process_group("topocoll", ...)  # env://, tcp:// or file://
"""
import json as _json

from . import _C

__all__ = ["plan", "tune"]
__version__ = _C.__version__  # the library's: 0.1.0+g<git describe>


def plan(topology, nodes=1, gpus_per_node=0, json=True, graph_in="", env=None, dtype="float32"):
    """Plans a job of `nodes` nodes, each described by the topology XML at path `topology`.

    Returns the plan as `topocoll plan --json` prints it (a dict; the JSON text with json=False). `env` overrides
    knobs (e.g. {"NCCL_ALGO": "ring"}); `graph_in` uses a graph XML instead of searching. Raises ValueError with
    the file, line, attribute or knob at fault on bad input.
    """
    text = _C._plan_json(str(topology), int(nodes), int(gpus_per_node), str(graph_in), dict(env or {}), str(dtype))
    return _json.loads(text) if json else text


def tune(topology, nodes=1, gpus_per_node=0, env=None, dtype="float32"):
    """The tuning tables and the algorithm/protocol/channel choice per size: the plan's `tuning` and `selection`."""
    p = plan(topology, nodes=nodes, gpus_per_node=gpus_per_node, env=env, dtype=dtype)
    return {"tuning": p["tuning"], "selection": p["selection"]}

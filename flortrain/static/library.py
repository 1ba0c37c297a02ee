"""What flortrain knows about library calls, so Flor's Table 2 rules are not fooled by them.

Flor assumes the effects of PyTorch code are assignments and encapsulated state updates from
method calls. Two refinements keep that assumption useful on real scripts:
- methods known not to mutate their receiver (``x.detach()``, ``t.item()``) do not put it in the
  changeset (rule 1/4 would otherwise make ``x = x.detach()`` unanalysable);
- functions known to mutate an argument (``random.shuffle(idx)``, any torch ``name_`` function)
  put that argument in the changeset instead of "No Estimate".
"""

from __future__ import annotations

#: Builtins that change none of their arguments.
PURE_BUILTINS = frozenset(
    [
        "print",
        "len",
        "range",
        "enumerate",
        "zip",
        "min",
        "max",
        "sum",
        "abs",
        "round",
        "float",
        "int",
        "str",
        "bool",
        "list",
        "dict",
        "tuple",
        "set",
        "frozenset",
        "sorted",
        "reversed",
        "isinstance",
        "issubclass",
        "hasattr",
        "getattr",
        "repr",
        "format",
        "any",
        "all",
        "map",
        "filter",
        "iter",
        "id",
        "type",
        "divmod",
        "pow",
        "hash",
        "chr",
        "ord",
        "hex",
        "oct",
        "bin",
        "callable",
        "vars",
        "dir",
        "locals",
        "globals",
        "super",
        "bytes",
        "bytearray",
        "complex",
        "slice",
        "object",
        "input",
        "open",
    ]
)

#: Builtins that mutate an argument: name -> index of the argument.
MUTATING_BUILTINS = {"next": 0, "setattr": 0, "delattr": 0}

#: Library functions (last dotted component) that mutate an argument, by index. Also applied to
#: methods of local objects: ``rng.shuffle(idx)`` on a ``np.random.Generator`` or
#: ``random.Random`` changes ``idx`` as well as ``rng``.
MUTATING_LIBRARY = {
    "shuffle": 0,  # random.shuffle, np.random.shuffle, Generator.shuffle
    # heapq and bisect keep their state in the list they are given
    "heappush": 0,
    "heappop": 0,
    "heappushpop": 0,
    "heapreplace": 0,
    "heapify": 0,
    "insort": 0,
    "insort_left": 0,
    "insort_right": 0,
    # numpy writes through: np.add.at(a, ...), np.copyto(dst, ...), np.put/place/putmask
    "at": 0,
    "copyto": 0,
    "put": 0,
    "place": 0,
    "putmask": 0,
    "fill_diagonal": 0,
}

#: Keyword arguments through which any call mutates the object passed: a private RNG
#: (``torch.randn(.., generator=g)``, ``torch.randperm(n, generator=g)``) and output buffers.
MUTATED_KEYWORDS = frozenset({"generator", "out"})

#: Functions that only move global RNG streams, which every checkpoint captures anyway.
RNG_SEEDERS = frozenset({"manual_seed", "seed", "manual_seed_all", "set_rng_state", "set_state"})

#: Methods that read their receiver without changing it (tensor, container and string reads).
PURE_METHODS = frozenset(
    [
        "detach",
        "clone",
        "item",
        "tolist",
        "numpy",
        "cpu",
        "cuda",
        "to",
        "float",
        "double",
        "half",
        "int",
        "long",
        "bool",
        "view",
        "view_as",
        "reshape",
        "size",
        "dim",
        "numel",
        "mean",
        "sum",
        "norm",
        "std",
        "var",
        "max",
        "min",
        "argmax",
        "argmin",
        "abs",
        "sqrt",
        "exp",
        "log",
        "pow",
        "softmax",
        "log_softmax",
        "sigmoid",
        "tanh",
        "relu",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "all",
        "any",
        "squeeze",
        "unsqueeze",
        "flatten",
        "permute",
        "transpose",
        "t",
        "contiguous",
        "expand",
        "expand_as",
        "repeat",
        "type_as",
        "chunk",
        "split",
        "unbind",
        "topk",
        "sort",
        "round",
        "floor",
        "ceil",
        "sign",
        "clamp",
        "masked_fill",
        "gather",
        "index_select",
        "matmul",
        "mm",
        "bmm",
        "mul",
        "add",
        "sub",
        "div",
        "get",
        "keys",
        "values",
        "items",
        "copy",
        "index",
        "count",
        "startswith",
        "endswith",
        "join",
        "format",
        "strip",
        "lower",
        "upper",
        "split",
        "replace",
        "state_dict",
        "parameters",
        "named_parameters",
        "buffers",
        "named_buffers",
        "modules",
        "named_modules",
        "children",
        "named_children",
        "get_last_lr",
        "isnan",
        "isinf",
        "isfinite",
        "nonzero",
        "unique",
    ]
)


def mutating_library_arg(func_name: str) -> int | None:
    """Which argument a library function mutates, if any (torch's trailing-underscore rule)."""
    last = func_name.rsplit(".", 1)[-1]
    if last in MUTATING_LIBRARY:
        return MUTATING_LIBRARY[last]
    if last.endswith("_") and not last.endswith("__"):
        return 0
    return None


#: Library constructors of output channels (``checkpoint/channels``), by their dotted import name,
#: and the kind of channel each makes. ``open`` in a write-only mode makes a ``file``.
SINK_CONSTRUCTORS = {
    "logging.getLogger": "logger",
    "csv.writer": "csv",
    "csv.DictWriter": "csv",
    "torch.utils.tensorboard.SummaryWriter": "summary",
    "torch.utils.tensorboard.writer.SummaryWriter": "summary",
    "tensorboardX.SummaryWriter": "summary",
    "tqdm.tqdm": "tqdm",
    "tqdm.trange": "tqdm",
    "tqdm.auto.tqdm": "tqdm",
    "tqdm.auto.trange": "tqdm",
    "tqdm.notebook.tqdm": "tqdm",
    "tqdm.std.tqdm": "tqdm",
    "wandb.init": "run",
}

#: The methods through which a script writes to a channel of each kind: outputs, not changes of
#: state, like ``print``. Any ``add_*`` of a SummaryWriter is one (``add_scalar``, ``add_image``).
SINK_METHODS = {
    "file": frozenset({"write", "writelines", "flush"}),
    "logger": frozenset(
        {"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log"}
    ),
    "csv": frozenset({"writerow", "writerows", "writeheader"}),
    "summary": frozenset({"flush"}),
    "tqdm": frozenset(
        {
            "update",
            "set_postfix",
            "set_postfix_str",
            "set_description",
            "set_description_str",
            "write",
            "refresh",
            "clear",
            "display",
        }
    ),
    "run": frozenset({"log"}),
}


def is_sink_method(kind: str, method: str) -> bool:
    """Whether calling ``method`` on a channel of ``kind`` only writes output."""
    return method in SINK_METHODS.get(kind, frozenset()) or (
        kind == "summary" and method.startswith("add_")
    )


_ALL_SINK_METHODS = frozenset().union(*SINK_METHODS.values())


def is_any_sink_method(method: str) -> bool:
    """Whether ``method`` writes output on a channel of some kind."""
    return method in _ALL_SINK_METHODS or method.startswith("add_")

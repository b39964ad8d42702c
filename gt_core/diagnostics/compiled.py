"""What ``torch.compile`` wrapped: the name to show for it, and the code objects Dynamo
compiles for it (where its cache entries are kept)."""

from __future__ import annotations

from gt_core.diagnostics import torch_hooks as hooks

__all__ = ["codes_of", "display_name"]

# What torch.nn.Module.compile() hands torch.compile: the module's own call.
_MODULE_CALLS = ("__call__", "_call_impl", "_wrapped_call_impl")


def display_name(fn) -> str:
    """A readable name of what torch.compile wrapped: function, method or module class."""
    fn = getattr(fn, "__wrapped__", fn)  # external_utils.wrap_inline keeps the module here
    owner = getattr(fn, "__self__", None)
    if owner is not None and fn.__name__ in _MODULE_CALLS:
        return type(owner).__name__
    if not hasattr(fn, "__qualname__") and hasattr(fn, "forward"):
        return type(fn).__name__
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    name = name.rsplit("<locals>.", 1)[-1]  # named as the compile records name it
    return name[: -len(".forward")] if name.endswith(".forward") else name


def codes_of(obj) -> tuple[str, list]:
    """(name, the code objects Dynamo may have compiled for ``obj``)."""
    owner = getattr(obj, "__self__", None)
    if hasattr(owner, "_modules") and getattr(obj, "__name__", "") in _MODULE_CALLS:
        obj = owner  # model.compile(): torch.compile of its _call_impl, which Dynamo skips
    mod = getattr(obj, "_orig_mod", None)
    if mod is not None:  # torch.compile(module)
        codes = [type(mod).forward.__code__]
        wrapper = hooks.innermost_fn(getattr(obj, "forward", None) or obj)
        if getattr(wrapper, "__code__", None) is not None:
            codes.append(wrapper.__code__)  # Dynamo's frame around torch.nn modules
        return type(mod).__name__, codes
    if hasattr(obj, "forward") and hasattr(obj, "_modules"):  # a module compiled in place
        return type(obj).__name__, [type(obj).forward.__code__]
    inner = hooks.innermost_fn(obj)
    inner = getattr(inner, "__func__", inner)
    code = getattr(inner, "__code__", None)
    if code is None:
        raise TypeError(
            f"gt_core.diagnostics.explain: expected a function or module compiled with "
            f"torch.compile, got {type(obj).__name__}"
        )
    return display_name(obj if not hasattr(obj, "_torchdynamo_orig_callable") else inner), [code]

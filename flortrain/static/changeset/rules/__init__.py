"""The changeset rules, one per module: Flor's Table 2 (rules 0-5, highest precedence first),
then what flortrain adds to them."""

from __future__ import annotations

from flortrain.static.changeset.rule import ChangesetRule


def all_rules() -> tuple[type[ChangesetRule], ...]:
    """Every rule, Table 2's in its order, then flortrain's own."""
    from flortrain.static.changeset.rules import (
        aliases,
        assignment,
        callbacks,
        callees,
        escapes,
        function_call,
        function_result,
        hooks,
        library_knowledge,
        loop_scoped,
        method_call,
        method_result,
        rebinding,
    )

    return (
        rebinding.Rebinding,
        method_result.MethodResult,
        function_result.FunctionResult,
        assignment.Assignment,
        method_call.MethodCall,
        function_call.FunctionCall,
        aliases.Aliases,
        library_knowledge.LibraryKnowledge,
        callees.Callees,
        callbacks.Callbacks,
        hooks.Hooks,
        loop_scoped.LoopScoped,
        escapes.Escapes,
    )

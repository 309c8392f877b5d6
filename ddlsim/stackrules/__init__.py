"""What each software stack can run: named plan rules, declared beside the stacks.

A :class:`StackRule` is a predicate over a plan (:class:`PlanFacts`) that is true where the
framework refuses the plan (an assertion in its argument checks, a feature it does not have),
with a short reason. The rules are registered by name (:func:`stack_rule`); each stack of
``ddlsim/data/software.yaml`` lists under ``rules:`` the names of those it obeys, each with
its source (the framework's code at a named commit)::

    deepspeed:
      rules:
        pipeline_zero: "DeepSpeed 38327e07 deepspeed/runtime/pipe/engine.py lines 77-78: ..."

The same rule objects judge one config (``RunConfig`` validation, via
:func:`check_stack_rules`: ``ddlsim predict``, ``sweep`` and ``ddlsim.predict``) and arrays of
plans (:func:`stack_rejections`: ``ddlsim search``). ``system.software: {stack: …, what_if:
true}`` lets a plan the stack cannot run be predicted anyway; the report says it is a what-if
(:func:`broken_rules`).

The package: the plan's facts and the registry (:mod:`.facts`), the rules, registered on
import (:mod:`.definitions`, :mod:`.moe_definitions`), and the checks that apply them
(:mod:`.checks`).
"""

from .facts import PlanFacts, StackRule, rules, stack_rule
from . import definitions, moe_definitions  # noqa: F401,E402  (registers the rules)
from .checks import (broken_rules, check_stack_rules, sp_rules, stack_rejections,
                     stack_rules, what_if_note)

__all__ = ["PlanFacts", "StackRule", "stack_rule", "rules", "stack_rules", "broken_rules",
           "sp_rules", "check_stack_rules", "stack_rejections", "what_if_note"]

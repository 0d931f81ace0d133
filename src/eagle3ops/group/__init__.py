"""Serving groups: several serving hosts behind one load balancer (the inventory's ``groups:``), released host by host.

``balancer`` (the :class:`~eagle3ops.group.balancer.Balancer` protocol a rollout uses: each host's state and
sessions, set ready/drain/maint), ``haproxy`` (HAProxy through its runtime API), ``drain`` (the capacity check under
``max_out`` and drain that means drained: 0 balancer sessions and 0 vLLM requests for 5 s, bounded, undrained on
timeout).

The rollout: ``rollout`` (the pure plan: canary, bake, roll; the return order), ``journal`` (the rollout's journal
and the group lock on the group's first host; the control requests ``promote``/``abort``/``pause``; replaying the
journal into where the rollout stands), ``execute`` (carrying a plan out with injected step callables: the capacity
wait, the bake judged by ``watch``'s rules, the return of every switched host on the first failure), ``steps`` (the
real step callables on inventory hosts) and ``status`` (what ``group status`` says).
"""

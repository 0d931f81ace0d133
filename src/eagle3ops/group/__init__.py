"""Serving groups: several serving hosts behind one load balancer (the inventory's ``groups:``).

``balancer`` (the :class:`~eagle3ops.group.balancer.Balancer` protocol a rollout uses: each host's state and
sessions, set ready/drain/maint), ``haproxy`` (HAProxy through its runtime API), ``drain`` (the capacity check under
``max_out`` and drain that means drained: 0 balancer sessions and 0 vLLM requests for 5 s, bounded, undrained on
timeout).
"""

"""The event task (GPLinker for events, Su 2022): every (event type, role) pair is a class of one span pointer (the
trigger one more role), and two one-head pointers link the arguments of one event by their starts and by their ends.

Parts so far: batch targets from a window table (`targets.event_targets`), host grouping of decoded hits into events
(`cliques.group_events`); the head is `gp_jax.models.events.EventHead`, device decoding `gp_jax.ops.events`.
"""

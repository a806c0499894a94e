"""Adapters that let RL frameworks call Tangram through the interfaces they already have:
:mod:`tangram_client.integrations.verl` (a custom reward function). OpenRLHF's remote
reward model is an HTTP endpoint; ``examples/openrlhf_reward_server.py`` serves one."""

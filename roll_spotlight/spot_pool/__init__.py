"""The spot pool: rollout workers that come and go with spot nodes.

- `pool`:           the pool's state machine (`ElasticSpotPool`): market events applied to workers.
- `ray_nodes`:      its Ray shell: spot workers as actors, a real cluster's spot nodes as events.
- `training_pool`:  the pool of a run's ``spot:`` section, with its market, prices and ledger.
- `emulated_nodes`: the spot raylets of a run on emulated GPUs (`spotlight train --emulate`).

The market itself (traces, `SpotMarket`, `MarketSchedule`, prices, ledger) is `roll_spotlight.spot`.
"""

"""Learn-to-Ask (learning proactive questioning from offline logs): sessions from MultiWOZ
dialogues or chat logs (:mod:`~pipelines.learn_to_ask.logs`), hindsight targets (I*_t, s*_t)
per assistant turn (:mod:`~pipelines.learn_to_ask.hindsight`) and the ``l2a_samples``
artifact (:mod:`~pipelines.learn_to_ask.tables`). The L2A reward is
:mod:`pipelines.rewards.learn_to_ask`."""

"""``l2a_questions``: the L2A reward (eq. 5) with R_a on the output's questions only.

The registered ``l2a`` reward grades the whole output with the rules grader, so an output
that asks nothing but names a slot of I*_t (a tool call's arguments, "I found 3 hotels in
the north area.") scores as a precise question: 1 + beta. Appendix G's grader scores "the
question(s)"; here an output without a question gets R_a = 0, as the held-out metrics score
it (:class:`pipelines.learn_to_ask.metrics.QuestionGrader`). A GRPO run names it by import
path: ``rewards: {"pipelines.learn_to_ask.reward:l2a_questions": 1.0}``.

>>> l2a_questions(["p"] * 2, ["Which area would you like?", "3 hotels are in the north area."],
...               decision_truth=["continue"] * 2, info_truth=[[{"field": "hotel-area", "value": "north"}]] * 2)
[4.0, 1.0]
"""

from __future__ import annotations

from pipelines.learn_to_ask.metrics import QuestionGrader
from pipelines.rewards.learn_to_ask import L2AReward, RulesGrader

l2a_questions = L2AReward(QuestionGrader(RulesGrader()), name="l2a_questions")

"""τ²-bench (retail, telecom, airline) through inspect_evals' implementation: ``astra-eval
tau2`` (:mod:`eval.tau2.runner`, a run of :func:`eval.runner.run_eval`), its conversations and
records (:mod:`eval.tau2.records`), the one module that touches inspect_ai — the endpoint path,
the conversation's state and the player (:mod:`eval.tau2.adapter`) — the gold replay model
(:mod:`eval.tau2.replay`), and τ² runs as the report and compare read them
(:mod:`eval.tau2.runs`). inspect_ai is imported only when a run starts."""

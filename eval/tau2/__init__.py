"""τ²-bench (retail, telecom, airline) through inspect_evals' implementation: ``astra-eval
tau2`` (:mod:`eval.tau2.runner`), the endpoint path (:mod:`eval.tau2.provider`) and the gold
replay model (:mod:`eval.tau2.replay`), and τ² runs as the report and compare read them
(:mod:`eval.tau2.runs`). inspect_ai is imported only when a run starts."""

"""The report's toolkit, shared by every eval kind's section (in its package's ``report.py``)
and the page (:mod:`eval.page`): blocks and cells (:mod:`~eval.report.blocks`), plotly figures
(:mod:`~eval.report.charts`), the training runs' curves (:mod:`~eval.report.curves`), the parts
of an entry's drill-down (:mod:`~eval.report.entries`), scores across runs
(:mod:`~eval.report.scores`), the comparison of two runs (:mod:`~eval.report.comparison`), and
the page's templates. It imports no eval package."""

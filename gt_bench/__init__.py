"""What gt is measured and shown on, apart from what it is: the workloads of the benchmarks,
the ``transformers`` model zoo (``zoo``), the corpus of real training loops (``corpus``),
the in-process benchmark (``python -m gt_bench.bench``), the demo and the notebooks'
examples. Nothing in ``gt_core`` or ``gt_jupyter`` imports it (an import-linter contract);
the libraries its models come from are the ``models`` and ``corpus`` extras.
"""

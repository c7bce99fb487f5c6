"""Test kit: the doubles and helpers of the tests, benchmarks and the sandbox.

Never imported by production code and never installed in a component image
(`hack/import_contracts.py` checks the first, the image build the second).
"""

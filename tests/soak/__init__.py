"""The randomized fault soak (issue 28): child workloads that are killed or crashed
(:mod:`soak.workloads`), the scenarios that start them and check what survived
(:mod:`soak.scenarios`); ``tests/test_soak.py`` runs them."""

"""A job's plan as the first planned jobs recorded it (before chosen_by, the modelled time,
the method): what PlanSummary must still load."""

FIRST_ROW = {"planned": True, "configuration": "lazy-tile8M", "feasible": True,
             "budget_mb": 400.0, "margin": 0.1, "predicted_peak_mb": 250.5,
             "predicted_memory_mb": {"weights": 200.0, "runtime": 50.5},
             "predicted_step_time_s": 1.25, "device_step_time_s_estimate": None,
             "smallest_budget_mb": 276, "smallest_configuration": "lazy-tile1M",
             "dominant_component": "weights"}

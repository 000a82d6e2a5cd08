"""What operators run on a machine: `fleet up` (local), `fleet install`, `fleet doctor`."""

"""Several replicas as one service: leadership (:mod:`lease`) and what they share in Redis."""

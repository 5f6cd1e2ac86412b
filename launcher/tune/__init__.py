"""`launcher tune`: candidates measured with loadgen, scored with confidence intervals."""

"""CI's own code: the notebook checker, the runners, the rehearsal. Never imported by ``helpers``."""

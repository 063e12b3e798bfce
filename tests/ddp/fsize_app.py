"""tests/ddp/app.py under a per-file size limit: a full disk where a small tmpfs cannot be mounted (not root).

``EPISODEPIPES_TEST_FSIZE`` bytes of RLIMIT_FSIZE make every write past that size fail with EFBIG (SIGXFSZ is
ignored), as in tests/test_sharding_disk_full.py. 4096 bytes hold this app's logs, records and model, but not one
overlay video (about 5 kB), so only the render passes meet the "full disk".
"""

import os
import resource
import signal

from ddp.app import main

if __name__ == "__main__":
    limit = int(os.environ["EPISODEPIPES_TEST_FSIZE"])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    main()

"""`loopnet` with a working folder of its own per rank: ``python -m tests.reliability.node_local DIR0 DIR1
<loopnet args>`` under torchrun runs rank r in DIRr, so a relative run folder (`--trainer.logger.init_args.save_dir
runs`) lies on a disk that only that rank sees, as on nodes without a shared filesystem."""

import os
import sys

if __name__ == "__main__":
    os.chdir(sys.argv[1 + int(os.environ["LOCAL_RANK"])])
    from loopnet.training.cli import main

    main(sys.argv[3:])

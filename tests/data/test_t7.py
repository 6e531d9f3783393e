import time, gc, weakref, os, glob
import torch.utils.data.dataloader as tdl
from tests.data.test_stream import draw, make_dm
def kids():
    me = os.getpid(); out = []
    for p in glob.glob("/proc/[0-9]*/stat"):
        try:
            f = open(p).read().split()
            if int(f[3]) == me: out.append(int(f[0]))
        except Exception: pass
    return out
def test_x(txt_corpus):
    kw = dict(seq_len=16, batch_size=2, seed=5, num_workers=2, source="files", path=txt_corpus[0], val_fraction=0.2, shuffle_buffer=7)
    orig = tdl._MultiProcessingDataLoaderIter._shutdown_workers
    def patched(self):
        t = time.time(); orig(self); print("   shutdown took", time.time() - t, flush=True)
    tdl._MultiProcessingDataLoaderIter._shutdown_workers = patched
    for n in (160, 1, 37, 95):
        t=time.time(); draw(kw, n); print(n, time.time()-t, "kids", kids(), flush=True)

"""Account cure's choices on the 1.5B pair at T=0: what the lookup graft, the node weight and the re-draft pass
won (exact flip gains) per set, and what the passes cost. Tuning prompts only."""
import sys, collections, json, torch
sys.path.insert(0, '/work/main/benchmarks')
import peers
from cure_core import calibration, redraft_price
log = []
orig_obs = calibration.FlipGains.observe
def obs(self, v, used, accepted, alt_held):
    log.append(("flip", id(self), v, used, calibration.flip_gain(used, accepted, alt_held)))
    return orig_obs(self, v, used, accepted, alt_held)
calibration.FlipGains.observe = obs
calibration.FlipGains.every = 1
orig_r = redraft_price.RedraftPrice.observe
def robs(self, v, gain, ms):
    log.append(("pass", v, gain, ms)); return orig_r(self, v, gain, ms)
redraft_price.RedraftPrice.observe = robs
args = peers.parse_args(['--target', 'qwen-coder-1.5b', '--sets', sys.argv[1], '--limit', sys.argv[2],
                         '--max-new-tokens', '32', '--threads', '2', '--strategies', 'cure'])
torch.set_num_threads(2)
setup = peers.load_setup(args)
m = [m for m in peers.build_methods(args, setup) if m.kind == 'cure'][0]
m.run(setup.prompts[0][2], 8)
eng = setup.engine
out = collections.defaultdict(lambda: collections.Counter())
for set_, tid, ids in setup.prompts:
    start = len(log)
    r = m.run(ids, 32)
    owners = {id(s.flips): 'lookup' for s in eng._lookups.values()} | {id(c.flips): 'weight' for c in eng._calibrations.values()}
    c = out[set_]
    c['blocks'] += r['target_forwards']; c['decode_ms'] += r['decode_ms']; c['draft_ms'] += r['draft_ms']; c['tree_ms'] += r['tree_ms']
    for e in log[start:]:
        if e[0] == 'flip':
            o = owners.get(e[1], '?'); c[f'{o}_measured'] += 1; c[f'{o}_used'] += e[3]
            c[f'{o}_gain_used'] += e[4] if e[3] else 0; c[f'{o}_gain_withheld'] += e[4] if not e[3] else 0
        else:
            c['passes'] += 1; c['pass_gain'] += e[2]; c['pass_ms'] += e[3]
for s, c in out.items():
    print(s, dict(c))
cal = next(iter(eng._calibrations.values()))
print('gammas', cal.gammas, 'weight', cal.weight())
json.dump({k: dict(v) for k, v in out.items()}, open('/tmp/prof/account.json', 'w'), indent=1)

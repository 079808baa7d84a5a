#!/usr/bin/env python3
"""Structural check of deploy/grafana-dashboard.json.

usage: check_dashboard.py DASHBOARD SCRAPE_FILE RULES_OUT

- every panel (rows excepted, nested ones included) has at least one target with an expr;
- every gs_* name in every expr (and in templating queries) is a metric the library exports,
  i.e. a family in SCRAPE_FILE (text exposition of a live exporter), histogram suffixes
  _bucket/_sum/_count included;
- every expr names at least one gs_* metric;
- writes RULES_OUT, a Prometheus rules file with every expr as a recording rule (Grafana
  variables replaced), so that `promtool check rules` checks the PromQL syntax.
"""
import json
import re
import sys

dash_path, scrape_path, rules_out = sys.argv[1:4]
exported = set()
for line in open(scrape_path):
    m = re.match(r"# TYPE (\S+) (\S+)", line)
    if m:
        name, kind = m.groups()
        exported.add(name)
        if kind in ("histogram", "summary"):
            exported.update({name + "_bucket", name + "_sum", name + "_count"})
exported = {n for n in exported if n.startswith("gs_")}
if not exported:
    sys.exit("no gs_ metrics in the scrape " + scrape_path)

dash = json.load(open(dash_path))
errors = []
exprs = []


def panels(ps):
    for p in ps:
        yield p
        yield from panels(p.get("panels", []))


def names(expr):
    return set(re.findall(r"\bgs_[a-zA-Z0-9_:]*", expr))


count = 0
for p in panels(dash.get("panels", [])):
    if p.get("type") == "row":
        continue
    count += 1
    title = p.get("title", "<untitled>")
    targets = [t for t in p.get("targets", []) if t.get("expr")]
    if not targets:
        errors.append(f"panel '{title}': no target with an expr")
    for t in targets:
        e = t["expr"]
        used = names(e)
        if not used:
            errors.append(f"panel '{title}': expr names no gs_ metric: {e}")
        for n in sorted(used - exported):
            errors.append(f"panel '{title}': {n} is not exported by gradstream")
        exprs.append((title, e))
for v in dash.get("templating", {}).get("list", []):
    q = v.get("query", "")
    q = q.get("query", "") if isinstance(q, dict) else q
    for n in sorted(names(q) - exported):
        errors.append(f"variable '{v.get('name')}': {n} is not exported by gradstream")
if count == 0:
    errors.append("dashboard has no panels")

with open(rules_out, "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (title, e) in enumerate(exprs):
        e = (e.replace("$__rate_interval", "1m").replace("$__interval", "1m")
             .replace("$__range", "1h"))
        e = re.sub(r"\$\{?[a-zA-Z_]+\}?", ".*", e)
        f.write(f"      - record: dashboard:panel{i}\n        expr: {json.dumps(e)}\n")

for e in errors:
    print("dashboard:", e)
print(f"dashboard: {count} panels, {len(exprs)} queries, {len(exported)} exported names")
sys.exit(1 if errors else 0)

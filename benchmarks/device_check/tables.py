"""device_check.md: the results as tables, a section per stage."""

from __future__ import annotations

from benchmarks.device_check.trainer import TRAINER_LABELS


def fmt(x, spec=".3g") -> str:
  if x is None:
    return "-"
  if isinstance(x, float):
    return format(x, spec)
  return str(x)


def trainer_markdown(t: dict) -> list[str]:
  """The trainer stage's table: one row per run."""
  if not t.get("runs"):
    return []
  setup, fake = t.get("setup", {}), t.get("fake_bert")
  fake = (f"Fake BERT ({fake.get('num_hidden_layers')} layers, D={fake.get('hidden_size')}, vocabulary "
          f"{fake.get('vocab_size')} rows, {fake.get('vocab_rows')} in vocab.txt; random weights). " if fake else "")
  lines = ["", f"## Trainer: `python -m gp_jax.main --config={setup.get('config')}` "
           f"{' '.join(setup.get('overrides', []))}", "",
           f"{fake}Seconds; compile: the compile-ahead line's wall / summed seconds, programs and cache hits / misses; "
           "steady: `train pace` ms/step by bucket. steps_per_execution: "
           f"{t.get('steps_per_execution', {}).get('note', '-')}.", "",
           "| run | status | first step (compile) | compile wall / summed | programs (hit / miss) | eval 1 / 2 | "
           "steady ms/step | checkpoint | whole wall | dev F1 |", "|---|---|---|---|---|---|---|---|---|---|"]
  for name, r in t["runs"].items():
    label = TRAINER_LABELS.get(name, name)
    if r.get("status") == "skipped":
      lines.append(f"| {label} | skipped: {r.get('why')} | | | | | | | | |")
      continue
    if name == "fused_vs_reference":
      lines.append(f"| {label} | {r.get('status')}: {r.get('verdict', '-')} (below) | | | | | | | | |")
      continue
    status = r.get("status", "-") + (f" (exit {r['rc']})" if r.get("rc") not in (0, None) else "")
    evals = f"{fmt(r.get('eval_first_s'), '.2f')} / {fmt(r.get('eval_second_s'), '.2f')}"
    if name == "anchor":
      epochs = " / ".join(f"{e['train_s']:.1f} s ({e['steps']})" for e in r.get("epochs", []))
      lines.append(f"| {label} | {status} | {fmt(r.get('first_step_s'), '.1f')} | - | - | {evals} | "
                   f"epochs (steps): {epochs or '-'} | - | {fmt(r.get('done_s') or r.get('wall_s'), '.1f')} | "
                   f"{fmt(r.get('dev_f1'), '.4f')} |")
      continue
    first = (f"{fmt(r.get('first_step_s'), '.1f')} ({fmt(r.get('first_step_compile_s'), '.1f')})"
             if r.get("first_step_s") is not None else "-")
    compile_s = (f"{fmt(r.get('compile_wall_s'), '.1f')} / {fmt(r.get('compile_summed_s'), '.1f')}"
                 if r.get("compile_wall_s") is not None else "-")
    programs = (f"{len(r['programs'])} ({r.get('cache_hits')} / {r.get('cache_misses')})" if r.get("programs")
                else "-")
    pace = ", ".join(f"L{k} {fmt(v['ms_per_step'], '.1f')}" for k, v in r.get("pace", {}).items()) or "-"
    ckpt = ", ".join(fmt(c["s"], ".2f") for c in r.get("checkpoints", [])) or "-"
    lines.append(f"| {label} | {status} | {first} | {compile_s} | {programs} | {evals} | {pace} | {ckpt} | "
                 f"{fmt(r.get('wall_s'), '.1f')} | {fmt(r.get('dev_f1'), '.4f')} |")
  for name, r in t["runs"].items():
    notes = [f"compiled on first use: {'; '.join(r['compiled_on_use'])}"] if r.get("compiled_on_use") else []
    growths = ", ".join(f"{g['at']} {g['hits']} hits -> {g['size']}" for g in r.get("hit_growths", []))
    notes += [f"hit buffer grown: {growths}"] if growths else []
    notes += [f"{r['steps']} steps in {r['calls']} calls"] if r.get("calls") else []
    if r.get("startup"):
      notes.append("to the first step (s): " + ", ".join(f"{k.replace('_', ' ')} {v:.1f}"
                                                         for k, v in r["startup"].items()))
    if notes:
      lines.append(f"- {TRAINER_LABELS.get(name, name)}: {'; '.join(notes)}")
  return lines + kernels_markdown(t["runs"].get("fused_vs_reference") or {})


def kernels_markdown(r: dict) -> list[str]:
  """The fused-vs-reference check: a row per side (an aborted one with its signal and last lines), the verdict
  against the bf16-vs-f32 gap, the parameters after one step."""
  if not r.get("sides"):
    return []
  sh = r.get("shape", {})
  lines = ["", f"## Fused vs reference step: {sh.get('layers')}-layer BERT (D={sh.get('hidden')}, {sh.get('heads')} "
           f"heads, FFN {sh.get('intermediate')}) + GP, B{sh.get('B')} x L{sh.get('L')}, {sh.get('steps')} steps, lr "
           f"{sh.get('lr')}", "", r.get("note", ""), "",
           "| step | status | kernels / update | attention, bits | dtype | compile s | loss first / last |",
           "|---|---|---|---|---|---|---|"]
  for name, x in r["sides"].items():
    if x.get("status") != "ok":
      how = f"**aborted ({x.get('signal')})**" if x.get("status") == "aborted" else (
          f"{x.get('status')}: {x.get('why') or x.get('error') or ''}")
      lines.append(f"| {name} | {how} | | | | | |")
      continue
    c, loss = x.get("choices") or {}, x.get("loss") or [None]
    lines.append(f"| {name} | ok | {c.get('bert_kernels')} / {c.get('optimizer_update')} | {c.get('attention')}, "
                 f"{c.get('dropout_bits')} | {x.get('dtype')} | {fmt(x.get('compile_wall_s'), '.1f')} | "
                 f"{fmt(loss[0], '.4f')} / {fmt(loss[-1], '.4f')} |")
  for name, x in r["sides"].items():
    if x.get("log_tail"):
      tail = [line for line in x["log_tail"] if line.strip()][-3:]
      lines.append(f"- {name}: its last lines: " + " / ".join(f"`{line.strip()}`" for line in tail))
  lines += ["", f"**{r.get('verdict', '-')}** (the bar: bf16 against f32, {r.get('gap')}, one H100 on 2026-11-26)."]
  if r.get("max_abs_loss_diff") is not None:
    lines.append(f"Same init: {r.get('same_init')}; largest relative gradient-norm difference "
                 f"{fmt(r.get('max_rel_grad_norm_diff'))}.")
  pa = r.get("params_after_one_step") or {}
  if pa.get("error"):
    lines.append(f"Parameters after one step: {pa['error']}.")
  elif pa:
    lines.append(f"Parameters after one step ({pa.get('leaves')} arrays): largest absolute difference "
                 f"{fmt(pa.get('max_abs'))} (`{pa.get('max_abs_leaf')}`); difference relative to the parameters "
                 f"{fmt(pa.get('rel_to_params'))}, to the reference step's update {fmt(pa.get('rel_to_update'))} "
                 "(L2 norms).")
  return lines


def train_step_markdown(t: dict) -> list[str]:
  """Stage train_step's table, a row per variant (an aborted one with its signal), its lost rows' last log lines,
  and the alternating rounds."""
  if not t.get("variants"):
    return []
  sh = t.get("shape", {})
  lines = ["", f"## Train step: BERT ({sh.get('layers')} layers, D={sh.get('hidden')}) + GP, B{sh.get('B')} x "
           f"L{sh.get('L')}", "", f"First step: {t.get('first_step', '-')} ({t.get('first_step_note', '-')}). "
           "ms/step: ours alone in its own process (median after a first step and 2 more), torch in the stage's "
           "process; compile s: backend compile (0 on a persistent-cache hit) / wall.", "",
           "| variant | status | ms/step | tokens/s | MFU | compile s | first step s | attention, bits, XLA options |",
           "|---|---|---|---|---|---|---|---|"]
  for key, x in t["variants"].items():
    label = x.get("label", key)
    if x.get("status") != "ok":
      note = x.get("why") or x.get("error")
      status = (f"**aborted ({x.get('signal')})**" if x.get("status") == "aborted" else
                x.get("status", "-") + (f": {note}" if note else ""))
      lines.append(f"| {label} | {status} | | | | | | |")
      continue
    mfu = x.get("mfu")
    c = x.get("choices") or {}
    kernels = (f"{c.get('attention')}, {c.get('dropout_bits')}, {c.get('xla_options') or '-'}" if c
               else x.get("attention", "-"))
    compile_s = (f"{fmt(x.get('compile_s'), '.1f')} / {fmt(x.get('compile_wall_s'), '.1f')}"
                 if x.get("compile_wall_s") is not None else "-")
    lines.append(f"| {label} | ok | {fmt(x['ms_per_step'], '.2f')} | {fmt(x['tokens_per_s'], ',.0f')} | "
                 f"{'-' if mfu is None else f'{100 * mfu:.1f}%'} | {compile_s} | "
                 f"{fmt(x.get('first_step_s'), '.1f')} | {kernels} |")
  for key, x in t["variants"].items():
    if x.get("log_tail"):
      tail = [line for line in x["log_tail"] if line.strip()][-3:]
      how = f"died by {x['signal']}" if x.get("signal") else f"{x.get('status')} ({x.get('error') or x.get('why')})"
      lines.append(f"- {x.get('label', key)}: {how}; its last lines: " + " / ".join(f"`{line.strip()}`"
                                                                                    for line in tail))
  lines += [f"- {x.get('label', key)}: {x['timed']}" for key, x in t["variants"].items()
            if x.get("status") == "ok" and not x.get("timed", "").endswith("then in the rounds")]
  if t.get("rounds"):
    lines += ["", f"Alternating rounds ({t.get('rounds_note', '')}):", "", "| variant | ms/step (median) | vs first |",
              "|---|---|---|"]
    lines += [f"| {x.get('label', n)} | {fmt(x['ms_median'], '.2f')} | {x['vs_first']} |"
              for n, x in t["rounds"].items()]
  return lines


def markdown(result: dict) -> str:
  st = result["stages"]
  lines = [f"# Device check, {result['started_utc']} UTC", "",
           f"`{result['command']}` on {result['host']}; budget {result['budget_s']:g} s, used "
           f"{result.get('elapsed_s', 0):g} s{' (tiny shapes)' if result['tiny'] else ''}.", "",
           "| stage | status | seconds (limit) |", "|---|---|---|"]
  for name, s in st.items():
    note = s.get("why") or s.get("error") or ""
    if s.get("lost"):  # variants lost inside a stage that went on
      note = "; ".join([note] * bool(note) + [f"lost {k} ({x})" for k, x in s["lost"].items()])
    lines.append(f"| {name} | {s['status']}{': ' + note if note else ''} | {s.get('seconds')} ({s.get('limit_s')}) |")
  v = st.get("versions", {})
  if v.get("versions"):
    info = v["versions"]
    lines += ["", "## Versions", "", f"python {info['python']}, jax {info['jax']}, jaxlib {info['jaxlib']}, backend "
              f"{info['backend']}, devices {', '.join(info['devices'])}, cuDNN {info.get('cudnn')}, nvidia-smi: "
              f"{info.get('nvidia_smi')}; {', '.join(f'{k} {x}' for k, x in info.get('packages', {}).items())}"]
  if v.get("peaks_gflops"):
    lines += ["", f"Matmul peaks, GFLOP/s ({v.get('peak_note', '')}):", "", "| dtype | jax | torch |", "|---|---|---|"]
    lines += [f"| {k} | {fmt(x.get('jax'), '.0f')} | {fmt(x.get('torch'), '.0f')} |" for k, x in
              v["peaks_gflops"].items()]
  lines += trainer_markdown(st.get("trainer", {}))
  a = st.get("attention", {})
  if a.get("compare"):
    lines += ["", "## Attention: bf16 against f32 XLA", "", a.get("compare_note", ""), "",
              "| L | impl | finite | out | dq | dk | dv |", "|---|---|---|---|---|---|---|"]
    for key, row in a["compare"].items():
      for impl in ("xla_bf16", "cudnn_bf16"):
        r = row.get(impl, {})
        if r.get("status") in ("skipped", "failed"):
          lines.append(f"| {row['L']} | {impl} | {r['status']}: {r.get('why') or r.get('error')} | | | | |")
        elif r:
          lines.append(f"| {row['L']} | {impl} | {r['finite']} | {fmt(r['out_rel_err'])} | {fmt(r['dq_rel_err'])} | "
                       f"{fmt(r['dk_rel_err'])} | {fmt(r['dv_rel_err'])} |")
  if a.get("dropout"):
    d = a["dropout"]
    lines += ["", "cuDNN fused dropout: " + (f"skipped ({d['why']})" if d.get("status") == "skipped" else
                                             ", ".join(f"{k} {fmt(x)}" for k, x in d.items() if k != "status"))]
  pr = st.get("precision", {})
  if pr.get("summary"):
    lines += ["", "## Precision: 2-layer BERT + GP, trajectories against f32 XLA seed 0", "",
              "| variant | final loss | max abs loss diff | max rel grad-norm diff |", "|---|---|---|---|"]
    lines += [f"| {n} | {fmt(x.get('final_loss'), '.4f')} | {fmt(x.get('max_abs_loss_diff'))} | "
              f"{fmt(x.get('max_rel_grad_norm_diff'))} |" for n, x in pr["summary"].items()]
    if pr.get("within_seed_noise"):
      lines += ["", "Within seed noise (max loss diff <= f32 seed 0 vs seed 1): " + ", ".join(
          f"{n}: {ok}" for n, ok in pr["within_seed_noise"].items())]
  lines += train_step_markdown(st.get("train_step", {}))
  sl = st.get("span_loss", {})
  if sl.get("runs"):
    lines += ["", "## Span loss + gradient (GlobalPointer, B=1)", "", "| run | ms | program GiB | compile s |",
              "|---|---|---|---|"]
    for n, x in sl["runs"].items():
      if x.get("status") != "ok":
        lines.append(f"| {n} | {x.get('status')}: {x.get('error')} | | |")
      else:
        lines.append(f"| {n} (H={x['H']}, D={x['D']}) | {fmt(x['ms'], '.2f')} | {fmt(x['program_gib'], '.3f')} | "
                     f"{fmt(x['compile_s'], '.1f')} |")
  ex = st.get("extras", {})
  for key in ("dropout_bits", "step_loop"):
    if ex.get(key):
      lines += ["", f"{key}: " + ", ".join(f"{k} {fmt(x)}" for k, x in ex[key].items())]
  return "\n".join(lines) + "\n"

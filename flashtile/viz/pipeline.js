// The recorded pipeline: one program's warps as lanes of bars, and the numbers read off the trace (the same
// definitions as flashtile/viz/pipeline.py's summary).
(function () {
  const $ = (id) => document.getElementById(id);
  const scopes = TRACE.scopes, clock = TRACE.meta.clock_mhz;
  const COLORS = {"wait Q free": "#d1d5db", "load Q": "#1d4ed8", "wait stage free": "#e5e7eb", "load K": "#2563eb",
    "load V": "#60a5fa", "wait Q": "#fde68a", "wait K/V": "#fbbf24", "wait turn": "#f3f4f6",
    "issue MMA": "#7c3aed", "wait QK": "#a78bfa", "softmax": "#059669", "wait PV": "#c4b5fd", "epilogue": "#dc2626"};
  const MEANING = {"wait stage free": "loader waits for a free ring stage", "load K": "TMA load of a K tile issued",
    "load V": "TMA load of a V tile issued", "wait K/V": "consumer waits for its K/V tile to arrive",
    "wait turn": "waits for its turn at the tensor cores", "issue MMA": "issues Q·Kᵀ (and P·V) to the tensor cores",
    "wait QK": "waits for Q·Kᵀ", "softmax": "online softmax in registers", "wait PV": "waits for P·V",
    "epilogue": "normalizes O and stores it", "wait Q": "waits for its Q rows", "load Q": "TMA load of Q rows",
    "wait Q free": "loader waits until a consumer frees its Q rows"};
  const LANE_H = 44, LEFT = 160;

  function union(intervals) {
    let total = 0, end = null;
    for (const [a, b] of intervals.slice().sort((x, y) => x[0] - y[0] || x[1] - y[1])) {
      if (end === null || a > end) { total += b - a; end = b; } else if (b > end) { total += b - end; end = b; }
    }
    return total;
  }
  function inFlight(events) {
    const issue = scopes.indexOf("issue MMA");
    const waits = new Set(["wait QK", "wait PV"].map((n) => scopes.indexOf(n)));
    const out = [];
    let start = null, end = null;
    for (const [s, a, b] of events) {
      if (s === issue) { if (start !== null && end !== null) out.push([start, end]); start = a; end = null; }
      else if (waits.has(s) && start !== null) end = b;
    }
    if (start !== null && end !== null) out.push([start, end]);
    return out;
  }
  function numbers(program) {
    const lanes = program.lanes;
    const span = Math.max(...lanes.map((l) => Math.max(...l.events.map((e) => e[2]))));
    const consumers = lanes.filter((l) => l.role.startsWith("consumer"));
    const loader = lanes.filter((l) => l.role === "loader");
    const durations = (ls, name) => ls.flatMap((l) => l.events.filter((e) => scopes[e[0]] === name)
      .map((e) => e[2] - e[1]));
    const sum = (xs) => xs.reduce((a, b) => a + b, 0);
    const share = (name) => sum(durations(consumers, name)) / (span * consumers.length);
    const kv = durations(consumers, "wait K/V"), stage = durations(loader, "wait stage free");
    return {span_us: span / clock, tensor_busy: union(consumers.flatMap((l) => inFlight(l.events))) / span,
      kv_wait_ns: 1000 * sum(kv) / Math.max(kv.length, 1) / clock, kv_wait_share: share("wait K/V"),
      softmax_share: share("softmax"), turn_wait_share: share("wait turn"),
      stage_wait_ns: 1000 * sum(stage) / Math.max(stage.length, 1) / clock,
      kv_waits: Math.floor(kv.length / Math.max(consumers.length, 1))};
  }
  const LABELS = [["span_us", "the program's time (µs)", (x) => x.toFixed(2)],
    ["tensor_busy", "tensor cores with products in flight (share of that time, an upper bound)", (x) => x.toFixed(3)],
    ["kv_waits", "waits for a K/V tile a consumer made (an item of n tiles: n + 1)", (x) => String(x)],
    ["kv_wait_ns", "a consumer's mean wait for a K/V tile (ns)", (x) => x.toFixed(1)],
    ["kv_wait_share", "consumers' time waiting for K/V (share)", (x) => x.toFixed(3)],
    ["softmax_share", "consumers' time in the softmax (share)", (x) => x.toFixed(3)],
    ["turn_wait_share", "consumers' time waiting for their turn (share)", (x) => x.toFixed(3)],
    ["stage_wait_ns", "the loader's mean wait for a free stage (ns): loads ahead of use", (x) => x.toFixed(1)]];

  function draw() {
    const program = TRACE.programs[Number($("program").value)];
    const svg = $("timeline"), width = svg.getAttribute("width") - LEFT - 10;
    const span = Math.max(...program.lanes.map((l) => Math.max(...l.events.map((e) => e[2]))));
    const zoom = Number($("zoom").value), shown = span / zoom;
    const from = (span - shown) * Number($("pan").value) / 1000, to = from + shown;
    const x = (c) => LEFT + (c - from) / shown * width;
    svg.setAttribute("height", program.lanes.length * LANE_H + 30);
    let out = "";
    program.lanes.forEach((lane, i) => {
      const y = 10 + i * LANE_H;
      out += '<text x="4" y="' + (y + 22) + '" font-size="12">' + lane.role + " (warp " + lane.warp + ")</text>";
      for (const [s, a, b] of lane.events) {
        if (b < from || a > to) continue;
        const x0 = Math.max(x(a), LEFT), x1 = Math.min(x(b), LEFT + width);
        out += '<rect class="bar" x="' + x0.toFixed(1) + '" y="' + y + '" width="' + Math.max(x1 - x0, 0.5).toFixed(1) +
          '" height="' + (LANE_H - 10) + '" fill="' + COLORS[scopes[s]] + '"><title>' + scopes[s] + ": " +
          ((b - a) / clock * 1000).toFixed(0) + " ns</title></rect>";
      }
    });
    const axisY = program.lanes.length * LANE_H + 22;
    out += '<text x="' + LEFT + '" y="' + axisY + '" font-size="11">' + (from / clock).toFixed(2) + " µs</text>";
    out += '<text x="' + (LEFT + width - 60) + '" y="' + axisY + '" font-size="11">' + (to / clock).toFixed(2) +
      " µs</text>";
    svg.innerHTML = out;
    $("window").textContent = "showing " + (from / clock).toFixed(2) + "–" + (to / clock).toFixed(2) + " µs of " +
      (span / clock).toFixed(2) + " µs";
    const n = numbers(program);
    const pct = (x) => (100 * x).toFixed(1) + "%";
    $("verdict").textContent = "In this program (CTA " + program.cta + ", " + n.span_us.toFixed(2) + " µs), the " +
      "tensor cores had products in flight " + pct(n.tensor_busy) + " of the time. A consumer waited " +
      n.kv_wait_ns.toFixed(1) + " ns on average for its next K/V tile (" + pct(n.kv_wait_share) + " of its time), " +
      "while the loader waited " + n.stage_wait_ns.toFixed(1) + " ns on average for a stage to free up: " +
      (n.stage_wait_ns > n.kv_wait_ns ? "the loads run ahead of the arithmetic, which sets the pace." :
        "the arithmetic waits on the loads here.") + " The softmax took " + pct(n.softmax_share) +
      " of a consumer's time, under the other consumer's products.";
    $("numbers").innerHTML = "<tr><th>what</th><th>value</th></tr>" + LABELS.map(([key, label, fmt]) =>
      '<tr><td style="text-align:left">' + label + '</td><td id="number-' + key + '">' + fmt(n[key]) + "</td></tr>")
      .join("");
  }
  function build() {
    TRACE.programs.forEach((p, i) => {
      const option = document.createElement("option");
      option.value = i;
      option.textContent = "CTA " + p.cta;
      $("program").appendChild(option);
    });
    $("legend").innerHTML = scopes.filter((s) => TRACE.programs.some((p) => p.lanes.some((l) =>
      l.events.some((e) => scopes[e[0]] === s)))).map((s) => '<span class="tile" style="background:' + COLORS[s] +
      '">·</span> ' + s + ": " + MEANING[s]).join(" &nbsp; ");
    const m = TRACE.meta;
    $("meta").textContent = m.kernel + ", " + m.config + "; batch " + m.batch + ", " + m.nheads + " heads, N=" +
      m.seqlen + ", D=" + m.head_dim + ", " + m.dtype + "; " + m.gpu + " at " + m.clock_mhz + " MHz" +
      (m.unrecorded_launch_us ? ". The longest recorded program ran " +  // its SM's cycles: SMs share no clock
        Math.max(...TRACE.programs.map((p) => numbers(p).span_us)).toFixed(1) + " µs (its SM's cycles at the clock " +
        "above); without the records the whole launch takes " + m.unrecorded_launch_us.toFixed(1) + " µs." : "");
    $("units").textContent = "times from SM clock cycles at " + clock + " MHz; shares are of the program's time";
    for (const id of ["program", "zoom", "pan"]) {
      for (const kind of ["input", "change"]) $(id).addEventListener(kind, draw);
    }
    draw();
  }
  build();
})();

// Step-through of one trace: HBM and SRAM boxes, counters, caption, kernel line; replayed from step 0.
(function () {
  const steps = TRACE.steps;
  let current = 0;  // number of steps applied
  let timer = null;
  const $ = (id) => document.getElementById(id);
  const tensors = Object.keys(TRACE.shapes);
  const pairs = steps.filter((s) => s.pair && s.pair.length);

  function gridSize(name) {
    const [rows, cols] = TRACE.shapes[name], [tr, tc] = TRACE.tiles[name];
    return [Math.ceil(rows / tr), Math.ceil(cols / tc)];
  }
  function build() {
    const hbm = $("hbm-tensors");
    for (const name of tensors) {
      const [gr, gc] = gridSize(name);
      const wrap = document.createElement("div");
      wrap.className = "tensor";
      wrap.innerHTML = '<div class="name">' + name + " " + TRACE.shapes[name].join("×") + "</div>";
      const grid = document.createElement("div");
      grid.className = "grid";
      grid.style.gridTemplateColumns = "repeat(" + gc + ", 22px)";
      for (let r = 0; r < gr; r++) for (let c = 0; c < gc; c++) {
        const tile = document.createElement("div");
        tile.className = "tile";
        tile.id = "hbm-" + name + "-" + r + "-" + c;
        tile.textContent = gc > 1 ? r + "," + c : r;
        grid.appendChild(tile);
      }
      wrap.appendChild(grid);
      hbm.appendChild(wrap);
    }
    const counters = $("counters");
    $("units").textContent = "bytes moved, counting " + TRACE.itemsize + " bytes per element (" +
      (TRACE.itemsize === 2 ? "fp16 / bf16" : TRACE.itemsize === 4 ? "fp32" : TRACE.itemsize + "-byte") + ")";
    counters.innerHTML = "<tr><th>tensor</th><th>read (bytes)</th><th>written (bytes)</th></tr>" +
      tensors.map((t) => '<tr><td style="text-align:left">' + t + '</td><td id="counter-' + t +
        '-read">0</td><td id="counter-' + t + '-written">0</td></tr>').join("") +
      '<tr><th>total</th><th id="counter-total-read">0</th><th id="counter-total-written">0</th></tr>';
    $("code").innerHTML = TRACE.code.map((line, i) => '<span class="line" id="code-line-' + i + '">' +
      String(i).padStart(2) + "  " + line.replace(/&/g, "&amp;").replace(/</g, "&lt;") + "</span>").join("");
    $("steps").innerHTML = steps.map((s, i) => '<li id="step-' + i + '">' + s.kind +
      (s.tensor ? " " + s.tensor + "[" + s.tile.join(",") + "]" : s.pair && s.pair.length ? " S(" + s.pair.join(",") +
       ")" : "") + " — " + s.caption + "</li>").join("");
    steps.forEach((s, i) => $("step-" + i).addEventListener("click", () => show(i + 1)));
    $("scrub").max = steps.length;
    if (pairs.length) {  // the (Q tile, K/V tile) work: done, being done, or skipped by the mask
      const [qr] = gridSize("Q"), [kr] = gridSize("K");
      const grid = $("work-grid");
      grid.style.gridTemplateColumns = "repeat(" + kr + ", 22px)";
      for (let i = 0; i < qr; i++) for (let j = 0; j < kr; j++) {
        const tile = document.createElement("div");
        tile.className = "tile";
        tile.id = "work-" + i + "-" + j;
        tile.textContent = i + "," + j;
        grid.appendChild(tile);
      }
      $("work").hidden = false;
    }
  }
  function show(n) {
    current = Math.max(0, Math.min(n, steps.length));
    const read = {}, written = {}, sram = {};
    for (const t of tensors) { read[t] = 0; written[t] = 0; }
    document.querySelectorAll("#hbm-tensors .tile, #work-grid .tile").forEach((el) => { el.className = "tile"; });
    for (let i = 0; i < current; i++) {
      const s = steps[i];
      if (s.pair && s.pair.length) {
        const cell = $("work-" + s.pair.join("-"));
        if (cell) cell.className = "tile " + (s.kind === "skip" ? "skip" : i === current - 1 ? "load" : "touched");
      }
      if (!s.tensor) continue;
      const el = $("hbm-" + s.tensor + "-" + s.tile.join("-"));
      if (s.kind === "load") { read[s.tensor] += s.bytes; sram[s.tensor] = s; }
      if (s.kind === "store") { written[s.tensor] += s.bytes; sram[s.tensor] = s; }
      if (el) el.className = "tile touched";
    }
    const last = current > 0 ? steps[current - 1] : null;
    if (last && last.tensor) {
      const el = $("hbm-" + last.tensor + "-" + last.tile.join("-"));
      if (el) el.className = "tile " + last.kind;
    }
    let totalRead = 0, totalWritten = 0;
    for (const t of tensors) {
      $("counter-" + t + "-read").textContent = read[t];
      $("counter-" + t + "-written").textContent = written[t];
      totalRead += read[t]; totalWritten += written[t];
    }
    $("counter-total-read").textContent = totalRead;
    $("counter-total-written").textContent = totalWritten;
    // on chip: what the current program loaded and has not written back; a store shows only at its own step
    const program = last ? last.program : "";
    $("program").textContent = program ? "· " + program : "";
    $("sram-tiles").innerHTML = Object.values(sram).filter((s) => s.program === program &&
      (s.kind === "load" || s === last)).map((s) =>
      '<span class="sram-tile ' + s.kind + '">' + s.tensor + "[" + s.tile.join(",") + "]" +
      (s.kind === "store" ? " → HBM" : "") + "</span>").join("");
    document.querySelectorAll("#code .line").forEach((el) => el.classList.remove("current"));
    document.querySelectorAll("#steps li").forEach((el) => el.classList.remove("current"));
    if (last) {
      $("code-line-" + last.line).classList.add("current");
      $("step-" + (current - 1)).classList.add("current");
      let at = current - 1;  // the latest step that carried running values
      while (at > 0 && !Object.keys(steps[at].state).length) at--;
      const shown = steps[at];
      const entries = Object.entries(shown.state);
      $("state").textContent = entries.length ? "after step " + (at + 1) + " (" + shown.caption + ")\n" +
        whose(shown) + entries.map(([k, v]) => k + " = " + JSON.stringify(v)).join("\n") : "";
    } else {
      $("state").textContent = "";
    }
    $("caption").textContent = last ? "Step " + current + ": " + last.caption : "Press play or step to begin.";
    $("scrub").value = current;
    $("position").textContent = current + " / " + steps.length;
  }
  function span(name, index) {  // "rows a–b" of a tensor's tile
    const size = TRACE.tiles[name][0], first = index * size;
    const last = Math.min(TRACE.shapes[name][0], first + size) - 1;
    return name + " tile " + index + " (rows " + first + "–" + last + ")";
  }
  function whose(step) {  // which query rows (and keys) the running values belong to
    if (!step.pair || !step.pair.length || !TRACE.tiles.Q || !TRACE.tiles.K) {
      return step.program ? step.program + ":\n" : "";
    }
    return "of " + span("Q", step.pair[0]) + ", after " + span("K", step.pair[1]) + ":\n";
  }
  function play() {
    if (timer) return;
    timer = setInterval(() => { if (current >= steps.length) pause(); else show(current + 1); },
                        parseInt($("speed").value, 10));
  }
  function pause() { clearInterval(timer); timer = null; }
  $("speed").addEventListener("change", () => { if (timer) { pause(); play(); } });
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "SELECT") return;
    if (e.key === " ") { e.preventDefault(); if (timer) pause(); else play(); }
    else if (e.key === "ArrowRight") { e.preventDefault(); pause(); show(current + 1); }
    else if (e.key === "ArrowLeft") { e.preventDefault(); pause(); show(current - 1); }
    else if (e.key === "Home") { e.preventDefault(); pause(); show(0); }
  });
  build();
  $("play").addEventListener("click", play);
  $("pause").addEventListener("click", pause);
  $("next").addEventListener("click", () => { pause(); show(current + 1); });
  $("prev").addEventListener("click", () => { pause(); show(current - 1); });
  $("reset").addEventListener("click", () => { pause(); show(0); });
  $("scrub").addEventListener("input", (e) => { pause(); show(parseInt(e.target.value, 10)); });
  show(0);
})();

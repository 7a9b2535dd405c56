// A small attention on real numbers, recomputed in the page whenever the causal mask is toggled or a value of
// Q, K or V is edited (or all are drawn again).
(function () {
  const { Q, K, V } = DATA;
  const n = Q.length, d = Q[0].length, scale = 1 / Math.sqrt(d);
  let seed = 1;
  const $ = (id) => document.getElementById(id);
  let picked = null;
  const state = {};

  function compute(causal) {
    const S = Q.map((q, i) => K.map((k, j) => (causal && j > i) ? -Infinity :
      q.reduce((acc, x, t) => acc + x * k[t], 0) * scale));
    const m = S.map((row) => Math.max(...row));
    const E = S.map((row, i) => row.map((s) => Math.exp(s - m[i])));
    const l = E.map((row) => row.reduce((a, b) => a + b, 0));
    const P = E.map((row, i) => row.map((e) => e / l[i]));
    const O = P.map((row) => V[0].map((_, c) => row.reduce((acc, p, j) => acc + p * V[j][c], 0)));
    Object.assign(state, { S, P, O, m, l });
  }
  function fmt(x) { return x === -Infinity ? "−∞" : x.toFixed(2); }
  function table(id, M, clickable, editable) {
    // a header row of column indices, a row index before each row: S[i][j] is query i against key j
    const t = $(id);
    const caption = t.querySelector("caption").outerHTML;
    const head = "<tr><th></th>" + M[0].map((_, j) => '<th class="index">' + j + "</th>").join("") + "</tr>";
    t.innerHTML = caption + head + M.map((row, i) => '<tr><th class="index">' + i + "</th>" + row.map((x, j) =>
      '<td id="' + id + "-" + i + "-" + j + '"' + (x === -Infinity || (id === "P" && x === 0) ? ' class="masked"' : "") +
      ">" + (editable ? '<input id="' + id + "-in-" + i + "-" + j + '" value="' + x.toFixed(2) + '">' : fmt(x)) +
      "</td>").join("") + "</tr>").join("");
    if (clickable) M.forEach((row, i) => row.forEach((_, j) =>
      $(id + "-" + i + "-" + j).addEventListener("click", () => pick(i, j))));
    if (editable) M.forEach((row, i) => row.forEach((_, j) =>
      $(id + "-in-" + i + "-" + j).addEventListener("change", (e) => {
        const x = parseFloat(e.target.value);
        if (Number.isFinite(x)) { M[i][j] = x; redraw(false); } else e.target.value = M[i][j].toFixed(2);
      })));
  }
  function random() {  // mulberry32, then Box-Muller: the same draws for the same seed
    seed = (seed + 0x6D2B79F5) | 0;
    let t = seed;
    const u = () => { t = Math.imul(t ^ (t >>> 15), t | 1); t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
                      return (((t ^ (t >>> 14)) >>> 0) + 1) / 4294967297; };
    return Math.sqrt(-2 * Math.log(u())) * Math.cos(2 * Math.PI * u());
  }
  function pick(i, j) {
    picked = [i, j];
    document.querySelectorAll(".matrix td").forEach((el) => el.classList.remove("hl", "picked"));
    for (let c = 0; c < n; c++) { $("S-" + i + "-" + c).classList.add("hl"); $("P-" + i + "-" + c).classList.add("hl"); }
    for (let c = 0; c < d; c++) {  // the row of Q, and the rows of K and V that this score uses
      $("O-" + i + "-" + c).classList.add("hl"); $("Q-" + i + "-" + c).classList.add("hl");
      $("K-" + j + "-" + c).classList.add("hl"); $("V-" + j + "-" + c).classList.add("hl");
    }
    $("S-" + i + "-" + j).classList.add("picked");
    $("P-" + i + "-" + j).classList.add("picked");
    const s = state.S[i][j], p = state.P[i][j];
    $("explain").textContent = s === -Infinity
      ? "Query " + i + " may not see key " + j + " (it is in the future): its score is −∞ and its weight 0."
      : "S[" + i + "][" + j + "] = q" + i + "·k" + j + " / √" + d + " = " + fmt(s) + ".  Row max m = " +
        fmt(state.m[i]) + ", denominator l = Σ exp(S[" + i + "][·] − m) = " + state.l[i].toFixed(3) +
        ".  P[" + i + "][" + j + "] = exp(" + fmt(s) + " − " + fmt(state.m[i]) + ") / " + state.l[i].toFixed(3) +
        " = " + p.toFixed(3) + ": the share of v" + j + " in O[" + i + "].";
  }
  function redraw(inputs = true) {
    compute($("causal").checked);
    table("S", state.S, true); table("P", state.P, true); table("O", state.O, false);
    if (inputs) { table("Q", Q, false, true); table("K", K, false, true); table("V", V, false, true); }
    if (picked) pick(picked[0], picked[1]);
  }
  $("causal").addEventListener("change", () => redraw());
  $("reseed").addEventListener("click", () => {
    for (const M of [Q, K, V]) M.forEach((row) => row.forEach((_, c) => { row[c] = Math.round(random() * 100) / 100; }));
    redraw();
  });
  redraw();
  window.PLAYGROUND = state;
})();

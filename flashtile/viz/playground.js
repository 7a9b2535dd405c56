// A small attention on real numbers, recomputed in the page whenever the causal mask is toggled.
(function () {
  const { Q, K, V } = DATA;
  const n = Q.length, d = Q[0].length, scale = 1 / Math.sqrt(d);
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
  function table(id, M, clickable) {
    const t = $(id);
    const caption = t.querySelector("caption").outerHTML;
    t.innerHTML = caption + M.map((row, i) => "<tr>" + row.map((x, j) =>
      '<td id="' + id + "-" + i + "-" + j + '"' + (x === -Infinity || (id === "P" && x === 0) ? ' class="masked"' : "") +
      ">" + fmt(x) + "</td>").join("") + "</tr>").join("");
    if (clickable) M.forEach((row, i) => row.forEach((_, j) =>
      $(id + "-" + i + "-" + j).addEventListener("click", () => pick(i, j))));
  }
  function pick(i, j) {
    picked = [i, j];
    document.querySelectorAll(".matrix td").forEach((el) => el.classList.remove("hl", "picked"));
    for (let c = 0; c < n; c++) { $("S-" + i + "-" + c).classList.add("hl"); $("P-" + i + "-" + c).classList.add("hl"); }
    for (let c = 0; c < d; c++) { $("O-" + i + "-" + c).classList.add("hl"); $("Q-" + i + "-" + c).classList.add("hl"); }
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
  function redraw() {
    compute($("causal").checked);
    table("S", state.S, true); table("P", state.P, true); table("O", state.O, false);
    table("Q", Q, false); table("K", K, false); table("V", V, false);
    if (picked) pick(picked[0], picked[1]);
  }
  $("causal").addEventListener("change", redraw);
  redraw();
  window.PLAYGROUND = state;
})();

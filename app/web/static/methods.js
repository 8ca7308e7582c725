// One look per training method on every chart: its name, colour and marker shape (Okabe-Ito,
// distinct without colour too). Loaded before the page's own script.
window.MEBP_METHODS = Object.freeze({
  mebp: {name: "MeBP", color: "#0072b2", symbol: "circle"},
  mezo: {name: "MeZO", color: "#e69f00", symbol: "square"},
  backprop: {name: "backprop", color: "#cc79a7", symbol: "triangle-up"},
});

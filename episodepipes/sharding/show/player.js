// The page's player: draws the plotly figures the page carries as JSON, and keeps each episode's videos and plot
// cursors on one clock (the first camera's video; a timer when an episode has no camera). Text from the dataset
// is never put into the page by this script: it is in the HTML already, escaped where the page was written.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("episodepipes-data").textContent);
  var show = { ready: false, episodes: [] };
  window.episodepipesShow = show;
  var config = { responsive: true, displaylogo: false };
  var pending = [];

  function draw(id, fig) {
    var drawn = Plotly.newPlot(id, fig.data, fig.layout, config);
    pending.push(drawn);
    return drawn;
  }

  function player(root, ep) {
    var videos = Array.prototype.slice.call(root.querySelectorAll("video"));
    var button = root.querySelector("button.play");
    var scrub = root.querySelector("input.scrub");
    var readout = root.querySelector("span.time");
    var plots = ep.plots.map(function (p) { return p.id; });
    var duration = ep.frames / ep.fps;
    var timer = { playing: false, at: 0, since: 0 };  // the clock of an episode without video
    var shown = -1, moving = false;

    function time() {
      if (videos.length) return videos[0].currentTime;
      if (!timer.playing) return timer.at;
      var t = timer.at + (performance.now() - timer.since) / 1000;
      if (t >= duration) { timer.playing = false; timer.at = duration; return duration; }
      return t;
    }
    function playing() { return videos.length ? !videos[0].paused && !videos[0].ended : timer.playing; }
    function play() {
      if (videos.length) return Promise.all(videos.map(function (v) { return v.play(); }));
      if (timer.at >= duration) timer.at = 0;
      timer.playing = true; timer.since = performance.now();
      return Promise.resolve();
    }
    function pause() {
      if (videos.length) videos.forEach(function (v) { v.pause(); });
      else { timer.at = time(); timer.playing = false; }
    }
    function seek(t) {
      t = Math.max(0, Math.min(duration, t));
      if (videos.length) videos.forEach(function (v) { v.currentTime = t; });
      else { timer.at = t; timer.since = performance.now(); }
    }
    function cursor() {
      return plots.map(function (id) { return document.getElementById(id).layout.shapes[0].x0; });
    }
    function tick() {
      var t = time();
      for (var k = 1; k < videos.length; k++) {  // the other cameras follow the first within a frame
        var v = videos[k];
        if (Math.abs(v.currentTime - t) > 1 / ep.fps) v.currentTime = t;
        if (v.paused !== videos[0].paused) { if (videos[0].paused) v.pause(); else v.play(); }
      }
      if (t !== shown && !moving) {
        shown = t;
        scrub.value = t;
        readout.textContent = t.toFixed(2) + " s, frame " + Math.min(ep.frames - 1, Math.floor(t * ep.fps + 1e-6));
        moving = true;
        Promise.all(plots.map(function (id) {
          return Plotly.relayout(id, { "shapes[0].x0": t, "shapes[0].x1": t });
        })).then(function () { moving = false; }, function () { moving = false; });
      }
      button.textContent = playing() ? "pause" : "play";
      window.requestAnimationFrame(tick);
    }

    button.addEventListener("click", function () { if (playing()) pause(); else play(); });
    scrub.max = duration;
    scrub.step = 1 / ep.fps;
    scrub.addEventListener("input", function () { pause(); seek(parseFloat(scrub.value)); });
    Promise.all(ep.plots.map(function (p) {
      return draw(p.id, p.figure).then(function (gd) {
        gd.on("plotly_click", function (e) { if (e.points.length) { pause(); seek(e.points[0].x); } });
      });
    })).then(function () { window.requestAnimationFrame(tick); });  // the cursors exist once the plots do
    return { videos: videos, plots: plots, time: time, cursor: cursor, play: play, pause: pause, seek: seek };
  }

  Object.keys(data.summary).forEach(function (id) { draw(id, data.summary[id]); });
  data.episodes.forEach(function (ep, i) {
    show.episodes.push(player(document.getElementById("episode-" + i), ep));
  });
  Promise.all(pending).then(function () { show.ready = true; });
})();

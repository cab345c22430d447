// Draws the charts whose data the server put in each canvas's data-chart attribute.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const activity = document.getElementById("activity");
  if (activity) {
    const data = JSON.parse(activity.dataset.chart);
    new Chart(activity, {
      type: "bar",
      data: {
        labels: data.labels,
        datasets: [
          { label: "started", data: data.started, backgroundColor: "#3b82f6" },
          { label: "finished", data: data.finished, backgroundColor: "#22c55e" },
        ],
      },
      options: { animation: false, scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } },
    });
  }
  const timeline = document.getElementById("timeline");
  if (timeline) {
    const data = JSON.parse(timeline.dataset.chart);
    new Chart(timeline, {
      type: "bar",
      data: {
        labels: data.labels,
        datasets: [{ data: data.bars, backgroundColor: data.colours, borderSkipped: false }],
      },
      options: {
        indexAxis: "y",
        animation: false,
        maintainAspectRatio: false,
        plugins: {
          legend: { display: false },
          tooltip: {
            callbacks: {
              label: (item) => {
                const [start, end] = item.raw;
                return `at ${start} ms, took ${(end - start).toFixed(1)} ms`;
              },
            },
          },
        },
        scales: { x: { title: { display: true, text: "ms since the saga started" } } },
      },
    });
  }
});

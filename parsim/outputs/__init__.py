"""What a prediction is turned into: the text and JSON report, the Chrome trace, the Gantt chart, the overlay."""

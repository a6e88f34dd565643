"""An example model package: ``model: {name: "mymodels.wide:wide_cnn"}`` in a job spec."""

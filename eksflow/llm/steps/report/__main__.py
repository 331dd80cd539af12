from eksflow.llm.steps.report.step import main

raise SystemExit(main())
